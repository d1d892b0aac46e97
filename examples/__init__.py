"""Examples a new user copies: a trainer of their own, and staging their own table as a bundle."""
