//! The `forge` command, built inside the test package so that the CLI tests can run it as a
//! process (`CARGO_BIN_EXE_forge-cli`).

fn main() -> std::process::ExitCode {
    forge_cli::main()
}
