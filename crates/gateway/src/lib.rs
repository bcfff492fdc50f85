//! keymaster's gateway library.
