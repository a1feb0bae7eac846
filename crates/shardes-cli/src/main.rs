//! The `shardes` command.

// Wired into the subcommands as they land.
#[allow(dead_code)]
mod config;

fn main() {}
