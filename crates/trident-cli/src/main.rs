//! The `trident` binary: the command line of [`trident_cli`].

fn main() -> anyhow::Result<()> {
    trident_cli::run()
}
