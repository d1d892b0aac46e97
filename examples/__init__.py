"""Examples a new user copies: a trainer of their own, staging their own table as a bundle, and a
Compute client of their own that follows jobs."""
