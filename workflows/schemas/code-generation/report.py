"""Plain-text reports for the shop owner."""


def stock_report(inventory):
    rows = []
    for isbn, book in sorted(inventory.books.items(), key=lambda kv: kv[1].title):
        rows.append(f"{book.title:<40} {book.author:<24} {inventory.copies.get(isbn, 0):>3}")
    return "\n".join(rows)


def reorder_report(inventory):
    wanted = inventory.to_reorder()
    if not wanted:
        return "Nothing to reorder."
    return "Reorder: " + ", ".join(inventory.books[i].title for i in wanted)
