//! keymaster's bake-off tools: the stub origin ([`stub`], `keymaster stub`) and the load
//! generator ([`load`], `keymaster load`).
pub mod load;
pub mod stub;
