//! The `shardes` command.

mod config;

fn main() {}
