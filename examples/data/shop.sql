-- A tiny shop for examples/data/sql_task.jsonl. Rebuild shop.sqlite from it with
--   rm -f examples/data/shop.sqlite && sqlite3 examples/data/shop.sqlite < examples/data/shop.sql
-- or, without the sqlite3 shell,
--   python -c "import sqlite3; sqlite3.connect('examples/data/shop.sqlite').executescript(open('examples/data/shop.sql').read())"
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    city TEXT NOT NULL
);
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT NOT NULL,
    price REAL NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers (id),
    product_id INTEGER NOT NULL REFERENCES products (id),
    quantity INTEGER NOT NULL
);
INSERT INTO customers (id, name, city) VALUES
    (1, 'Ada', 'London'),
    (2, 'Grace', 'New York'),
    (3, 'Alan', 'London'),
    (4, 'Edsger', 'Amsterdam'),
    (5, 'Barbara', 'New York');
INSERT INTO products (id, name, category, price) VALUES
    (1, 'pencil', 'stationery', 1.5),
    (2, 'notebook', 'stationery', 4.0),
    (3, 'lamp', 'home', 25.0),
    (4, 'mug', 'home', 8.0),
    (5, 'kettle', 'home', 30.0),
    (6, 'eraser', 'stationery', 0.5);
INSERT INTO orders (id, customer_id, product_id, quantity) VALUES
    (1, 1, 1, 10),
    (2, 1, 3, 1),
    (3, 2, 2, 3),
    (4, 2, 4, 2),
    (5, 3, 1, 5),
    (6, 3, 5, 1),
    (7, 4, 4, 4),
    (8, 5, 2, 1),
    (9, 5, 6, 20),
    (10, 1, 4, 2);
