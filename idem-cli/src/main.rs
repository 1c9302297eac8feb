//! `idem`, the operator's command line: see the `idem_cli` library.

fn main() -> std::process::ExitCode {
    idem_cli::main()
}
