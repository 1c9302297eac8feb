//! `idem`, the operator's command line: see `idem_runtime::cli`.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let code = idem_runtime::cli::run(std::env::args_os(), &mut out, &mut err).await;
    std::process::ExitCode::from(code)
}
