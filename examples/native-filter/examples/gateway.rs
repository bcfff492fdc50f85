//! keymaster with the example's native filter types, as a user's binary is written:
//!
//! ```text
//! API_KEYS_ALICE=k1 cargo run -p keymaster-example-native-filter --example gateway -- \
//!     run --config examples/native-filter/gateway.toml
//! ```

use keymaster_example_native_filter::{ApiAuth, Stamp};

#[global_allocator]
static GLOBAL: keymaster::Allocator = keymaster::Allocator;

fn main() -> std::process::ExitCode {
    keymaster::Keymaster::new()
        .native_type("api_auth", ApiAuth::from_params)
        .native_type("stamp", Stamp::from_params)
        .main()
}
