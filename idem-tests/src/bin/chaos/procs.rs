//! The processes of a chaos run: payments replicas, the far sides, and a
//! private PostgreSQL, Redis or DynamoDB emulator; each started, killed
//! (`SIGKILL`), frozen (`SIGSTOP`) and thawed (`SIGCONT`) by the harness.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Sends `signal` to `pid`.
pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a pid this harness started; no memory is shared.
    unsafe {
        libc::kill(pid as i32, signal);
    }
}

/// A child that prints a line starting with `ready` once it serves, with
/// its stderr after that appended to `log`.
pub struct Proc {
    /// What to run, to start it again.
    program: PathBuf,
    args: Vec<String>,
    /// Variables set in its environment (a skewed clock's preload, a
    /// store's credentials), at every start.
    env: Vec<(String, String)>,
    ready: &'static str,
    log: PathBuf,
    child: Option<Child>,
    /// Whether it is frozen (SIGSTOP) now.
    pub stopped: bool,
}

impl Proc {
    /// Starts `program args` with `env` added to its environment, and waits
    /// until it prints `ready`.
    pub async fn start(
        program: PathBuf,
        args: Vec<String>,
        env: Vec<(String, String)>,
        ready: &'static str,
        log: PathBuf,
    ) -> Result<Proc, String> {
        let mut proc = Proc {
            program,
            args,
            env,
            ready,
            log,
            child: None,
            stopped: false,
        };
        proc.restart().await?;
        Ok(proc)
    }

    /// The value given after `flag` on its command line.
    pub fn arg_after(&self, flag: &str) -> String {
        self.args
            .iter()
            .skip_while(|a| *a != flag)
            .nth(1)
            .cloned()
            .unwrap_or_default()
    }

    /// The running child's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Whether it runs (started and not killed).
    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// `kill -9`, and waits for the exit.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.stopped {
                if let Some(pid) = child.id() {
                    signal(pid, libc::SIGCONT);
                }
                self.stopped = false;
            }
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Freezes it (`SIGSTOP`).
    pub fn freeze(&mut self) {
        if let Some(pid) = self.pid() {
            signal(pid, libc::SIGSTOP);
            self.stopped = true;
        }
    }

    /// Thaws it (`SIGCONT`).
    pub fn thaw(&mut self) {
        if let Some(pid) = self.pid() {
            signal(pid, libc::SIGCONT);
        }
        self.stopped = false;
    }

    /// Starts it (again), and waits until it says it serves: 30 s at most.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.kill().await;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", self.program.display()))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut lines = BufReader::new(stderr).lines();
        let ready = self.ready;
        let mut log = tokio::fs::File::from_std(log);
        let seen = tokio::time::timeout(Duration::from_secs(30), async {
            use tokio::io::AsyncWriteExt;
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = log.write_all(format!("{line}\n").as_bytes()).await;
                if line.starts_with(ready) {
                    return true;
                }
            }
            false
        })
        .await;
        if seen != Ok(true) {
            let _ = child.start_kill();
            return Err(format!(
                "{} did not start (see {})",
                self.program.display(),
                self.log.display()
            ));
        }
        // The rest of stderr goes to the log, so the child never blocks.
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = log.write_all(format!("{line}\n").as_bytes()).await;
            }
        });
        self.child = Some(child);
        Ok(())
    }

    /// Starts it (again), its stdout and stderr to the log, and waits until
    /// it accepts connections on `port`: for a server that says nothing when
    /// it is ready.
    async fn restart_until_port(&mut self, port: u16) -> Result<(), String> {
        self.kill().await;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", self.program.display()))?;
        self.child = Some(child);
        wait_port(port).await
    }
}

/// Runs a command to its end; its output goes to `log`.
pub async fn run(program: &Path, args: &[&str], log: &Path) -> Result<(), String> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| e.to_string())?;
    let status = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .status()
        .await
        .map_err(|e| format!("{}: {e}", program.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {args:?}: {status} (see {})",
            program.display(),
            log.display()
        ))
    }
}

/// A free TCP port on 127.0.0.1 (bound and released: good enough for a
/// harness that starts its processes at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A private PostgreSQL or Redis server, restarted by the nemesis: never the
/// shared ones on 5432 and 6379.
pub enum StoreServer {
    /// No server: SQLite.
    None,
    /// `initdb` and `pg_ctl` on a data directory of the run's.
    Postgres {
        bin: PathBuf,
        data: PathBuf,
        port: u16,
        log: PathBuf,
        /// `runuser -u postgres --` when running as root.
        as_postgres: bool,
        /// PgBouncer's port, in transaction mode in front of the server
        /// (`scripts/pgbouncer`): the replicas reach the database through
        /// it, as a team with several replicas does.
        pooler: u16,
    },
    /// `redis-server` with an append-only file synced at every write, so a
    /// kill -9 loses nothing acknowledged.
    Redis(Box<Proc>),
    /// moto's DynamoDB emulator, serving one table of the run's.
    DynamoDb {
        emulator: Box<Proc>,
        port: u16,
        table: String,
    },
}

impl StoreServer {
    /// A PostgreSQL cluster in `dir`, serving on `port`.
    pub async fn postgres(dir: &Path, port: u16) -> Result<StoreServer, String> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .map_err(|e| format!("/usr/lib/postgresql: {e}"))?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|b| b.join("pg_ctl").exists())
            .max()
            .ok_or("no pg_ctl under /usr/lib/postgresql/*/bin")?;
        // SAFETY: getuid has no preconditions.
        let as_postgres = unsafe { libc::getuid() } == 0;
        let data = dir.join("pg");
        let log = dir.join("pg.log");
        std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
        if as_postgres {
            run(
                Path::new("chown"),
                &["-R", "postgres", &dir.display().to_string()],
                &log,
            )
            .await?;
        }
        let server = StoreServer::Postgres {
            bin,
            data,
            port,
            log,
            as_postgres,
            pooler: free_port(),
        };
        server
            .pg(&[
                "initdb",
                "-D",
                "{data}",
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ])
            .await?;
        server.start().await?;
        server.pgbouncer("start").await?;
        Ok(server)
    }

    /// `scripts/pgbouncer ACTION` for this server's pooler.
    async fn pgbouncer(&self, action: &str) -> Result<(), String> {
        let StoreServer::Postgres {
            port, pooler, log, ..
        } = self
        else {
            return Ok(());
        };
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/pgbouncer");
        let out = Command::new(&script)
            .arg(action)
            .env("IDEM_PGBOUNCER_PORT", pooler.to_string())
            .env("IDEM_PGBOUNCER_UPSTREAM", format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("{}: {e}", script.display()))?;
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            use std::io::Write;
            let _ = f.write_all(text.as_bytes());
        }
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("scripts/pgbouncer {action}: {text}"))
        }
    }

    /// The port the replicas' store traffic goes to: PgBouncer's in front
    /// of PostgreSQL, Redis' own.
    pub fn client_port(&self, server_port: u16) -> u16 {
        match self {
            StoreServer::Postgres { pooler, .. } => *pooler,
            _ => server_port,
        }
    }

    /// PgBouncer killed (-9) and started again: every client connection
    /// through it breaks, and the transactions in flight end without an
    /// answer. `Ok(false)` for a store without a pooler.
    pub async fn crash_restart_pooler(&mut self) -> Result<bool, String> {
        if !matches!(self, StoreServer::Postgres { .. }) {
            return Ok(false);
        }
        self.pgbouncer("restart").await.map(|()| true)
    }

    /// A Redis server in `dir`, serving on `port`.
    pub async fn redis(dir: &Path, port: u16) -> Result<StoreServer, String> {
        let data = dir.join("redis");
        std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
        let args = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &data.display().to_string(),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--loglevel",
            "warning",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // redis-server logs to stdout; the harness waits for its port.
        let proc = Proc {
            program: PathBuf::from("redis-server"),
            args,
            env: Vec::new(),
            ready: "",
            log: dir.join("redis.log"),
            child: None,
            stopped: false,
        };
        let mut server = StoreServer::Redis(Box::new(proc));
        server.restart_redis(port).await?;
        Ok(server)
    }

    async fn restart_redis(&mut self, port: u16) -> Result<(), String> {
        let StoreServer::Redis(proc) = self else {
            return Ok(());
        };
        proc.restart_until_port(port).await
    }

    /// A DynamoDB emulator of the run's own (`scripts/dynamodb-emulator
    /// serve`: moto, in memory) on `port`, never the shared one on 4567,
    /// with the table `table` created in it.
    pub async fn dynamodb(dir: &Path, port: u16, table: &str) -> Result<StoreServer, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/dynamodb-emulator");
        let mut proc = Proc {
            program: script,
            args: vec!["serve".into()],
            env: vec![("IDEM_DYNAMODB_PORT".into(), port.to_string())],
            ready: "",
            log: dir.join("dynamodb.log"),
            child: None,
            stopped: false,
        };
        proc.restart_until_port(port).await?;
        Ok(StoreServer::DynamoDb {
            emulator: Box::new(proc),
            port,
            table: table.to_owned(),
        })
    }

    /// Whether the nemesis may crash and restart it. The DynamoDB emulator
    /// keeps its tables in memory: a restart would lose every record, which
    /// DynamoDB never does, and the run would report the emulator.
    pub fn crashes(&self) -> bool {
        matches!(self, StoreServer::Postgres { .. } | StoreServer::Redis(_))
    }

    /// What a client of this store needs in its environment: DynamoDB's
    /// credentials (the emulator checks no signature, the SDK wants some).
    pub fn client_env(&self) -> Vec<(String, String)> {
        match self {
            StoreServer::DynamoDb { .. } => vec![
                ("AWS_ACCESS_KEY_ID".into(), "testing".into()),
                ("AWS_SECRET_ACCESS_KEY".into(), "testing".into()),
            ],
            _ => Vec::new(),
        }
    }

    /// The URL a client of this server uses at `port` (the server's own, or
    /// a proxy's in front of it).
    pub fn url(&self, port: u16) -> String {
        match self {
            StoreServer::None => String::new(),
            StoreServer::Postgres { .. } => {
                format!("postgres://postgres@127.0.0.1:{port}/postgres")
            }
            StoreServer::Redis(_) => format!("redis://127.0.0.1:{port}"),
            StoreServer::DynamoDb { table, .. } => {
                format!("dynamodb://{table}?region=us-east-1&endpoint=http://127.0.0.1:{port}")
            }
        }
    }

    async fn pg(&self, args: &[&str]) -> Result<(), String> {
        let StoreServer::Postgres {
            bin,
            data,
            log,
            as_postgres,
            ..
        } = self
        else {
            return Ok(());
        };
        let data = data.display().to_string();
        let args: Vec<String> = args.iter().map(|a| a.replace("{data}", &data)).collect();
        let program = bin.join(&args[0]).display().to_string();
        let mut full: Vec<&str> = Vec::new();
        if *as_postgres {
            full.extend(["-u", "postgres", "--", &program]);
        }
        full.extend(args[1..].iter().map(String::as_str));
        if *as_postgres {
            run(Path::new("runuser"), &full, log).await
        } else {
            run(Path::new(&program), &full, log).await
        }
    }

    async fn start(&self) -> Result<(), String> {
        if let StoreServer::Postgres { port, data, .. } = self {
            let options = format!(
                "-p {port} -c listen_addresses=127.0.0.1 -k {} -c max_connections=200",
                data.display()
            );
            self.pg(&[
                "pg_ctl", "-D", "{data}", "-o", &options, "-w", "-t", "60", "start",
            ])
            .await?;
        }
        Ok(())
    }

    /// A crash and a start: `pg_ctl stop -m immediate` (no checkpoint, as a
    /// power cut), or `kill -9` of Redis.
    pub async fn crash_restart(&mut self) -> Result<(), String> {
        match self {
            StoreServer::None | StoreServer::DynamoDb { .. } => Ok(()),
            StoreServer::Postgres { .. } => {
                self.pg(&["pg_ctl", "-D", "{data}", "-m", "immediate", "-w", "stop"])
                    .await?;
                self.start().await
            }
            StoreServer::Redis(proc) => {
                let port: u16 = proc.arg_after("--port").parse().expect("the port given");
                self.restart_redis(port).await
            }
        }
    }

    /// Stops it at the end of the run.
    pub async fn shut_down(&mut self) {
        match self {
            StoreServer::None => {}
            StoreServer::Postgres { .. } => {
                let _ = self.pgbouncer("stop").await;
                let _ = self
                    .pg(&["pg_ctl", "-D", "{data}", "-m", "fast", "-w", "stop"])
                    .await;
            }
            StoreServer::Redis(proc) => proc.kill().await,
            StoreServer::DynamoDb { emulator, .. } => emulator.kill().await,
        }
    }
}

/// Waits until something accepts connections on `port`: 30 s at most.
pub async fn wait_port(port: u16) -> Result<(), String> {
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("nothing listens on 127.0.0.1:{port} after 30 s"))
}
