//! The store's earlier function libraries, and a replica of each version
//! replayed: this version's store behind a proxy that turns its commands
//! into the ones that version sent.
//!
//! The libraries (`tests/data/redis/library-COMMIT.lua`) are what each
//! version sent with `FUNCTION LOAD`, byte for byte: each version's
//! `lua/*.lua` files (`git show COMMIT:idem-runtime/src/store/redis/lua/…`)
//! assembled as its `scripts.rs` assembled them (the state and reply codes,
//! `library.lua`, `prelude.lua`, `jobs.lua`, then each script registered as
//! a function), which is also how this version's is assembled
//! ([`this_library_is_assembled_so`]): the same assembly gives 8d26ab9's
//! library as a version of it loaded it, and each file's name line is the
//! hash of its code (`fixtures_are_what_their_name_says`). One file per
//! library the repository's history holds since the store became a library
//! (43fbf8b): nine in all with this version's.
//!
//! A version's commands are this version's with that version's library
//! and these differences, the only ones between the versions' Rust sides
//! (`git diff COMMIT -- idem-runtime/src/store/redis/{mod,scripts}.rs`),
//! made by the proxy: the function names (each library's); `FUNCTION LOAD`
//! sends that version's library; before ab52487 a lookup named the
//! reference by its tag only and a purge sent no SCAN count; before 846a7be
//! a job was 13 fields (the proxy adds the two later ones, empty, to what
//! the library answers); before 7aa3abc the reconciler asked the processor
//! without taking the record's check (the proxy answers the take as taken
//! and sends nothing) and a deferral was the delay alone; at 7aa3abc a take
//! answered `OK` rather than the hold's end, and a deferral knew no taken
//! check. Everything else is the bytes that version sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use idem_runtime::RedisStore;

/// How an earlier version's reconciler took a record's check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checks {
    /// It did not: it asked the processor at once; a deferral was the
    /// delay alone.
    NotTaken,
    /// Through `defer_check` with `'1'`, answered `OK`; a deferral was the
    /// delay and `'0'`.
    TakenOk,
    /// As this version.
    AsNow,
}

/// A library of an earlier version of the store.
#[derive(Clone, Copy, Debug)]
pub struct Earlier {
    /// The commit that made it.
    pub commit: &'static str,
    /// What that version sent with `FUNCTION LOAD`.
    pub code: &'static str,
    /// Before ab52487: a lookup without the whole reference, a purge
    /// without the SCAN count.
    pub tag_only: bool,
    /// A job's fields in its answers: 13 before 846a7be, then 15.
    pub job_fields: usize,
    pub checks: Checks,
    /// Before ab52487: a COMPLETED record's native expiry was the end of its
    /// window, not of its retention.
    pub window_only: bool,
}

impl Earlier {
    /// The library's name, from its first line.
    pub fn name(&self) -> &'static str {
        self.code
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("#!lua name="))
            .expect("a library's first line names it")
    }
}

/// Every library the repository held before this version's, oldest first.
pub const EARLIER: [Earlier; 8] = [
    Earlier {
        commit: "43fbf8b",
        code: include_str!("../data/redis/library-8d26ab9.lua"),
        tag_only: true,
        job_fields: 13,
        checks: Checks::NotTaken,
        window_only: true,
    },
    Earlier {
        commit: "ab52487",
        code: include_str!("../data/redis/library-ab52487.lua"),
        tag_only: false,
        job_fields: 13,
        checks: Checks::NotTaken,
        window_only: false,
    },
    Earlier {
        commit: "846a7be",
        code: include_str!("../data/redis/library-846a7be.lua"),
        tag_only: false,
        job_fields: 15,
        checks: Checks::NotTaken,
        window_only: false,
    },
    Earlier {
        commit: "d00057a",
        code: include_str!("../data/redis/library-d00057a.lua"),
        tag_only: false,
        job_fields: 15,
        checks: Checks::NotTaken,
        window_only: false,
    },
    Earlier {
        commit: "3ca6590",
        code: include_str!("../data/redis/library-3ca6590.lua"),
        tag_only: false,
        job_fields: 15,
        checks: Checks::NotTaken,
        window_only: false,
    },
    Earlier {
        commit: "1ed7957",
        code: include_str!("../data/redis/library-1ed7957.lua"),
        tag_only: false,
        job_fields: 15,
        checks: Checks::NotTaken,
        window_only: false,
    },
    Earlier {
        commit: "7aa3abc",
        code: include_str!("../data/redis/library-7aa3abc.lua"),
        tag_only: false,
        job_fields: 15,
        checks: Checks::TakenOk,
        window_only: false,
    },
    Earlier {
        commit: "30d3a83",
        code: include_str!("../data/redis/library-30d3a83.lua"),
        tag_only: false,
        job_fields: 15,
        checks: Checks::AsNow,
        window_only: false,
    },
];

/// A Redis value, as RESP2 carries it.
#[derive(Clone, Debug, PartialEq)]
enum Resp {
    Simple(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Resp::Simple(s) => out.extend([&b"+"[..], s, b"\r\n"].concat()),
            Resp::Error(s) => out.extend([&b"-"[..], s, b"\r\n"].concat()),
            Resp::Int(n) => out.extend(format!(":{n}\r\n").into_bytes()),
            Resp::Bulk(None) => out.extend(b"$-1\r\n"),
            Resp::Bulk(Some(b)) => {
                out.extend(format!("${}\r\n", b.len()).into_bytes());
                out.extend(b);
                out.extend(b"\r\n");
            }
            Resp::Array(None) => out.extend(b"*-1\r\n"),
            Resp::Array(Some(items)) => {
                out.extend(format!("*{}\r\n", items.len()).into_bytes());
                for item in items {
                    item.write(out);
                }
            }
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }
}

/// Reads one value; `None` at the end of the stream.
async fn read(r: &mut (impl AsyncBufRead + Unpin)) -> std::io::Result<Option<Resp>> {
    let mut line = Vec::new();
    if r.read_until(b'\n', &mut line).await? == 0 {
        return Ok(None);
    }
    let text = &line[1..line.len() - 2];
    let number = || -> i64 { std::str::from_utf8(text).unwrap().parse().unwrap() };
    Ok(Some(match line[0] {
        b'+' => Resp::Simple(text.to_vec()),
        b'-' => Resp::Error(text.to_vec()),
        b':' => Resp::Int(number()),
        b'$' => match number() {
            -1 => Resp::Bulk(None),
            n => {
                let mut b = vec![0; n as usize + 2];
                r.read_exact(&mut b).await?;
                b.truncate(n as usize);
                Resp::Bulk(Some(b))
            }
        },
        b'*' => match number() {
            -1 => Resp::Array(None),
            n => {
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(Box::pin(read(r)).await?.expect("a whole array"));
                }
                Resp::Array(Some(items))
            }
        },
        other => panic!("a RESP2 value starts with {:?}", other as char),
    }))
}

/// What the proxy makes of one command.
enum Step {
    /// Send this, and answer the server's reply rewritten by the function.
    Send(Resp, fn(&Earlier, Resp) -> Resp),
    /// Send nothing; answer this.
    Answer(Resp),
}

fn same(_: &Earlier, reply: Resp) -> Resp {
    reply
}

/// A job listing's reply (the time, then each job's fields) with the two
/// fields 846a7be added, empty, after each job of 13.
fn jobs_of_15(earlier: &Earlier, reply: Resp) -> Resp {
    if earlier.job_fields == 15 {
        return reply;
    }
    let Resp::Array(Some(items)) = reply else {
        return reply;
    };
    let mut out = vec![items[0].clone()];
    for job in items[1..].chunks(13) {
        out.extend(job.iter().cloned());
        out.extend([Resp::Bulk(None), Resp::Bulk(None)]);
    }
    Resp::Array(Some(out))
}

/// 7aa3abc's answer to a take (`OK`) as this version's (`TAKEN` and the
/// hold's end).
fn taken_until(_: &Earlier, reply: Resp) -> Resp {
    match reply {
        Resp::Array(Some(items)) if items == [Resp::Int(0)] => {
            // The hold it wrote ends `hold` after the server's time; the
            // caller reads only that the check was taken, and compares the
            // end with the deferral it sends back, which 7aa3abc ignored.
            Resp::Array(Some(vec![Resp::Int(7), Resp::Int(now_micros())]))
        }
        other => other,
    }
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

fn text(v: &Resp) -> &[u8] {
    match v {
        Resp::Bulk(Some(b)) | Resp::Simple(b) => b,
        _ => b"",
    }
}

/// The command `earlier`'s store sent where this version's sends `cmd`.
fn step(earlier: &Earlier, cmd: Resp, made: &AtomicUsize) -> Step {
    let Resp::Array(Some(mut words)) = cmd else {
        return Step::Send(cmd, same);
    };
    let verb = text(&words[0]).to_ascii_uppercase();
    if verb == b"FUNCTION" && text(&words[1]).eq_ignore_ascii_case(b"LOAD") {
        let last = words.len() - 1;
        words[last] = Resp::Bulk(Some(earlier.code.as_bytes().to_vec()));
        made.fetch_add(1, Ordering::Relaxed);
        return Step::Send(Resp::Array(Some(words)), same);
    }
    if verb != b"FCALL" {
        return Step::Send(Resp::Array(Some(words)), same);
    }
    let ours = format!("{}_", RedisStore::library_name());
    let name = String::from_utf8(text(&words[1]).to_vec()).unwrap();
    let function = name
        .strip_prefix(&ours)
        .unwrap_or_else(|| panic!("a function of this version's library: {name}"))
        .to_owned();
    words[1] = Resp::Bulk(Some(format!("{}_{function}", earlier.name()).into_bytes()));
    made.fetch_add(1, Ordering::Relaxed);
    let keys: usize = std::str::from_utf8(text(&words[2]))
        .unwrap()
        .parse()
        .unwrap();
    let args = 3 + keys;
    let mut reply: fn(&Earlier, Resp) -> Resp = same;
    match function.as_str() {
        "lookup" | "purge" if earlier.tag_only => {
            words.pop();
        }
        "lease_jobs" | "list_jobs" => reply = jobs_of_15,
        "defer_check" => {
            // [packed head, delay or hold, '0' defer / '1' take, taken?]
            let take = text(&words[args + 2]) == b"1";
            match (earlier.checks, take) {
                (Checks::NotTaken, true) => {
                    let hold: i64 = std::str::from_utf8(text(&words[args + 1]))
                        .unwrap()
                        .parse()
                        .unwrap();
                    return Step::Answer(Resp::Array(Some(vec![
                        Resp::Int(7),
                        Resp::Int(now_micros() + hold),
                    ])));
                }
                (Checks::NotTaken, false) => words.truncate(args + 2),
                (Checks::TakenOk, true) => reply = taken_until,
                (Checks::TakenOk, false) => words.truncate(args + 3),
                (Checks::AsNow, _) => {}
            }
        }
        "find" => panic!("{}'s store had no find", earlier.commit),
        _ => {}
    }
    Step::Send(Resp::Array(Some(words)), reply)
}

/// A proxy in front of a Redis server that makes this version's store
/// speak as `earlier`'s did (see the module's notes), serving until
/// dropped.
pub struct AsEarlier {
    pub url: String,
    /// Commands it changed.
    pub made: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AsEarlier {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AsEarlier {
    /// In front of the server at `upstream` (`host:port`).
    pub async fn start(upstream: &str, earlier: Earlier) -> AsEarlier {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}", listener.local_addr().unwrap());
        let made = Arc::new(AtomicUsize::new(0));
        let (upstream, counted) = (upstream.to_owned(), made.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, made) = (upstream.clone(), counted.clone());
                tokio::spawn(async move {
                    let _ = serve(client, &upstream, &earlier, &made).await;
                });
            }
        });
        AsEarlier { url, made, task }
    }
}

/// One client connection: each command rewritten, sent, and its reply
/// rewritten back, in order.
async fn serve(
    client: TcpStream,
    upstream: &str,
    earlier: &Earlier,
    made: &AtomicUsize,
) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    let (client_in, mut client_out) = client.into_split();
    let (server_in, mut server_out) = server.into_split();
    let (mut client_in, mut server_in) = (BufReader::new(client_in), BufReader::new(server_in));
    while let Some(cmd) = read(&mut client_in).await? {
        let answer = match step(earlier, cmd, made) {
            Step::Answer(answer) => answer,
            Step::Send(cmd, rewrite) => {
                server_out.write_all(&cmd.bytes()).await?;
                let reply = read(&mut server_in).await?.expect("the server answers");
                rewrite(earlier, reply)
            }
        };
        client_out.write_all(&answer.bytes()).await?;
    }
    Ok(())
}

/// The library an earlier version's code is, as its `scripts.rs` assembled
/// it: the body after the `#!lua name=…` and `local LIBRARY` lines.
fn body_of(code: &str) -> &str {
    let mut lines = code.splitn(3, '\n');
    let (_, _, body) = (lines.next(), lines.next(), lines.next().unwrap());
    body
}

/// The name a library's body gets: `idem_` and 16 hex digits of its
/// SHA-256.
fn name_of(body: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(body.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("idem_{hex}")
}

/// Each fixture is the library its name says (its name the hash of its
/// code), and no two are one.
#[test]
fn fixtures_are_what_their_name_says() {
    let mut names = std::collections::BTreeSet::new();
    for earlier in EARLIER {
        let body = body_of(earlier.code);
        assert_eq!(name_of(body), earlier.name(), "{}", earlier.commit);
        assert!(
            earlier.code.starts_with(&format!(
                "#!lua name={0}\nlocal LIBRARY = '{0}'\n",
                earlier.name()
            )),
            "{}",
            earlier.commit
        );
        assert!(names.insert(earlier.name()), "{}", earlier.commit);
    }
    assert!(!names.contains(RedisStore::library_name()));
}

/// The assembly the fixtures were made with makes this version's library:
/// the same name as the store's.
#[test]
fn this_library_is_assembled_so() {
    macro_rules! lua {
        ($name:literal) => {
            include_str!(concat!(
                "../../../idem-runtime/src/store/redis/lua/",
                $name,
                ".lua"
            ))
        };
    }
    let scripts: [(&str, bool, &str); 20] = [
        ("claim", false, lua!("claim")),
        ("complete", false, lua!("complete")),
        ("release", false, lua!("release")),
        ("mark_unknown", false, lua!("mark_unknown")),
        ("resolve", false, lua!("resolve")),
        ("defer_check", false, lua!("defer_check")),
        ("heartbeat", false, lua!("heartbeat")),
        ("lookup", true, lua!("lookup")),
        ("find", true, lua!("find")),
        ("list", false, lua!("list")),
        ("purge", false, lua!("purge")),
        ("scan", true, lua!("scan")),
        ("peek_jobs", true, lua!("peek_jobs")),
        ("lease_jobs", false, lua!("lease_jobs")),
        ("finish_job", false, lua!("finish_job")),
        ("retry_job", false, lua!("retry_job")),
        ("bury_job", false, lua!("bury_job")),
        ("redrive_job", false, lua!("redrive_job")),
        ("list_jobs", false, lua!("list_jobs")),
        ("count_due_jobs", false, lua!("count_due_jobs")),
    ];
    let mut body = String::from(
        "local IN_PROGRESS = '0'\nlocal COMPLETED = '1'\nlocal UNKNOWN = '2'\n\
         local NOT_PERFORMED = '3'\nlocal OK, FENCED, WRONG_STATE, NOT_SETTLED, HELD_BACK, \
         CLAIMED, FOUND, TAKEN = 0, 1, 2, 3, 4, 5, 6, 7\n",
    );
    body.push_str(lua!("library"));
    body.push_str(lua!("prelude"));
    body.push_str(lua!("jobs"));
    for (name, reads_only, code) in scripts {
        let flags = if reads_only { "{'no-writes'}" } else { "{}" };
        body.push_str(&format!(
            "register('{name}', {flags}, function()\n{code}end)\n"
        ));
    }
    assert_eq!(name_of(&body), RedisStore::library_name());
}
