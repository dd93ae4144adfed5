"""Customer orders: a basket of books, checked out against the inventory."""

from inventory import Inventory


class Order:
    def __init__(self, customer):
        self.customer = customer
        self.lines = []  # (isbn, quantity)

    def add(self, isbn, quantity=1):
        if quantity < 1:
            raise ValueError("quantity must be at least 1")
        self.lines.append((isbn, quantity))

    def total_cents(self, inventory: Inventory):
        return sum(inventory.books[isbn].price_cents * q for isbn, q in self.lines)

    def checkout(self, inventory: Inventory):
        for isbn, q in self.lines:
            for _ in range(q):
                inventory.take(isbn)
        return self.total_cents(inventory)
