//! The `forge` command: see the `forge_cli` library.

fn main() -> std::process::ExitCode {
    forge_cli::main()
}
