//! keymaster's bake-off tools: the stub origin ([`stub`], `keymaster stub`) and the load
//! generator ([`load`], `keymaster load`), and the bake-off runner with its report ([`bench`],
//! `keymaster bench`).
pub mod bench;
pub mod load;
pub mod stub;
