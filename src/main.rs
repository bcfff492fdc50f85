//! The `keymaster` binary: the command line with the built-in and Lua filters. A binary
//! with filters of its own looks the same (`docs/filters.md`, "Your own binary").

#[global_allocator]
static GLOBAL: keymaster::Allocator = keymaster::Allocator;

fn main() -> std::process::ExitCode {
    keymaster::Keymaster::new().main()
}
