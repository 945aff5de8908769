//! `trident-custom`: the `trident` command line with this example's layers registered.
//!
//! ```sh
//! cargo run --release -p trident-custom-layer -- train --config examples/custom_layer/penguins.toml
//! ```

fn main() -> anyhow::Result<()> {
    trident_custom_layer::register();
    trident_cli::run()
}
