//! keymaster's bake-off tools.
