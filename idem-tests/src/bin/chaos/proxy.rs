//! A TCP proxy the nemesis turns: it passes bytes, delays the answers, holds
//! everything (a partition), drops the answers while requests still go
//! through (the request lands, its answer is lost), or cuts every
//! connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to the bytes now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Both ways, at once.
    Pass,
    /// Answers (upstream to client) wait this long.
    Delay(Duration),
    /// Nothing goes either way; connections stay open.
    Hold,
    /// Requests go through; answers are thrown away.
    DropAnswers,
}

/// One proxy, listening on a port of its own, to `upstream`.
#[derive(Clone)]
pub struct Proxy {
    /// The port it listens on.
    pub port: u16,
    mode: Arc<Mutex<Mode>>,
    /// Bumped to cut every live connection.
    cuts: watch::Sender<u64>,
}

impl Proxy {
    /// Listens on a free port, forwarding to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let (cuts, _) = watch::channel(0);
        let proxy = Proxy {
            port,
            mode: Arc::new(Mutex::new(Mode::Pass)),
            cuts,
        };
        let serving = proxy.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let proxy = serving.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        proxy.pipe(client, server).await;
                    }
                });
            }
        });
        proxy
    }

    /// Sets the mode.
    pub fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap_or_else(|e| e.into_inner()) = mode;
    }

    /// Closes every live connection.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn pipe(&self, client: TcpStream, server: TcpStream) {
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let mut cut = self.cuts.subscribe();
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let up = self.copy(client_read, server_write, false);
        let down = self.copy(server_read, client_write, true);
        tokio::select! {
            _ = up => {}
            _ = down => {}
            _ = cut.changed() => {}
        }
        // Dropping both halves of both sockets closes them.
    }

    async fn copy(
        &self,
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        answers: bool,
    ) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Held bytes wait for the mode to change (or the cut).
            loop {
                match self.mode() {
                    Mode::Hold => tokio::time::sleep(Duration::from_millis(20)).await,
                    Mode::Delay(d) if answers => {
                        tokio::time::sleep(d).await;
                        break;
                    }
                    _ => break,
                }
            }
            if answers && self.mode() == Mode::DropAnswers {
                continue;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
}
