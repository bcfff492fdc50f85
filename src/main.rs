//! The `keymaster` binary: wires the subcommands.
fn main() {}
