//! A store URL that cannot be read, or a command line that is wrong: refused
//! with what to do instead.

use idem_cli::{EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE};

use crate::operator::idem;

#[tokio::test]
async fn configuration_mistakes_say_what_to_do() {
    let missing = idem("sqlite:/nonexistent/idem.sqlite3", &["stats"]).await;
    assert_eq!(missing.code, EXIT_USAGE, "{missing:?}");
    assert!(
        missing.err.contains("give the path the server uses"),
        "{}",
        missing.err
    );
    let nonsense = idem("mysql://x", &["stats"]).await;
    assert_eq!(nonsense.code, EXIT_USAGE, "{nonsense:?}");
    assert!(nonsense.err.contains("sqlite:PATH"), "{}", nonsense.err);
    let memory = idem("memory", &["stats"]).await;
    assert_eq!(memory.code, EXIT_USAGE, "{memory:?}");
    // Nothing listens on port 1.
    let unreachable = idem("postgres://idem@127.0.0.1:1/idem", &["stats"]).await;
    assert_eq!(unreachable.code, EXIT_UNREACHABLE, "{unreachable:?}");
    let no_command = idem("memory", &[]).await;
    assert_eq!(no_command.code, EXIT_USAGE, "{no_command:?}");
    let help = idem("memory", &["--help"]).await;
    assert_eq!(help.code, EXIT_OK, "{help:?}");
    assert!(help.out.contains("Exit codes"), "{}", help.out);
}
