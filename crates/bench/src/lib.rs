//! keymaster's bake-off tools: the stub origin ([`stub`]) and, later, the load generator.
pub mod stub;
