"""Stock of a small bookshop: books, copies on the shelf, and reorder rules."""

from dataclasses import dataclass, field


@dataclass
class Book:
    isbn: str
    title: str
    author: str
    price_cents: int


@dataclass
class Inventory:
    books: dict = field(default_factory=dict)   # isbn -> Book
    copies: dict = field(default_factory=dict)  # isbn -> copies on the shelf
    reorder_below: int = 2

    def add(self, book, count=1):
        self.books[book.isbn] = book
        self.copies[book.isbn] = self.copies.get(book.isbn, 0) + count

    def take(self, isbn):
        if self.copies.get(isbn, 0) < 1:
            raise KeyError(f"no copy of {isbn} left")
        self.copies[isbn] -= 1

    def to_reorder(self):
        return [isbn for isbn, n in self.copies.items() if n < self.reorder_below]
