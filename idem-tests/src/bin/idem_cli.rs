//! The `idem` command line for the tests and the chaos run: the same call
//! as idem-cli's `idem` binary.

fn main() -> std::process::ExitCode {
    idem_cli::main()
}
