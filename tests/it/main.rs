//! Integration tests of the `forge` facade against a real PostgreSQL.

fn main() {}
