//! A private PostgreSQL cluster for fault-injection tests: `initdb` into a temporary
//! directory, on its own loopback port, stopped and started at will — so a test can take the
//! database away under load, or serve it over TLS, without touching the shared server other
//! tests use. The binaries come from `$SAMEWISE_TEST_PG_BIN`, else `pg_config --bindir`, else
//! the newest `/usr/lib/postgresql/*/bin`. PostgreSQL refuses to run as root: when the test
//! runs as root, every server command runs as the `postgres` user (`runuser`) on a directory
//! handed to that user. The cluster is stopped (immediately) and deleted when dropped.
//!
//! [`TlsFiles::generate`] makes, with the `openssl` CLI, a throwaway CA and a server
//! certificate for `127.0.0.1` signed by it; [`PgCluster::start_tls`] serves with them and
//! accepts TCP connections over TLS only (`hostssl`).

use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use super::TestDb;
use crate::StoreError;

/// A running (or stopped) private PostgreSQL cluster.
pub struct PgCluster {
    /// Holds the data directory, its log and the socket; deleted on drop.
    dir: TempDir,
    /// Where `initdb`, `pg_ctl` and `postgres` are.
    bin: PathBuf,
    /// The TCP port on 127.0.0.1.
    port: u16,
    /// Run server commands as the `postgres` user (the test runs as root).
    as_postgres: bool,
}

/// A CA certificate and a server certificate and key for `127.0.0.1` signed by it, in one
/// temporary directory.
pub struct TlsFiles {
    /// Holds the files; deleted on drop.
    dir: TempDir,
}

impl TlsFiles {
    /// Makes the CA and the server certificate with `openssl` (EC P-256, valid 2 days).
    pub fn generate() -> io::Result<TlsFiles> {
        let dir = tempfile::Builder::new()
            .prefix("samewise-test-tls")
            .tempdir()?;
        let p = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(
            dir.path().join("server.ext"),
            "subjectAltName = IP:127.0.0.1\nbasicConstraints = critical, CA:FALSE\n\
             keyUsage = critical, digitalSignature, keyEncipherment\n\
             extendedKeyUsage = serverAuth\n",
        )?;
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
        ca.extend(ec);
        let (ca_key, ca_crt) = (p("ca.key"), p("ca.crt"));
        ca.extend(["-keyout", &ca_key, "-out", &ca_crt]);
        ca.extend(["-subj", "/CN=samewise test CA"]);
        ca.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        ca.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        run(Command::new("openssl").args(&ca), "openssl req (CA)")?;
        let (key, csr, crt, ext) = (
            p("server.key"),
            p("server.csr"),
            p("server.crt"),
            p("server.ext"),
        );
        let mut req = vec!["req", "-nodes"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=127.0.0.1"]);
        run(Command::new("openssl").args(&req), "openssl req (server)")?;
        let sign = [
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &crt,
            "-extfile",
            &ext,
        ];
        run(Command::new("openssl").args(sign), "openssl x509 (sign)")?;
        Ok(TlsFiles { dir })
    }

    /// The CA certificate (PEM): `sslrootcert=` for clients.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server certificate (PEM).
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// The server's private key (PEM).
    pub fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }
}

impl PgCluster {
    /// Creates and starts a cluster (trust authentication for `postgres` over TCP).
    pub async fn start() -> io::Result<PgCluster> {
        blocking(|| PgCluster::create(None)).await
    }

    /// Creates and starts a cluster with `ssl = on` and `tls`'s server certificate, accepting
    /// TCP connections over TLS only.
    pub async fn start_tls(tls: &TlsFiles) -> io::Result<PgCluster> {
        let files = (tls.server_cert(), tls.server_key());
        blocking(move || PgCluster::create(Some(files))).await
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`: the maintenance database.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A fresh migrated database on this cluster, as [`TestDb::postgres`] makes on the shared
    /// server (`admin_url` may carry TLS parameters; they are kept).
    pub async fn test_db(&self, admin_url: &str) -> Result<TestDb, StoreError> {
        TestDb::postgres_on(admin_url).await
    }

    /// Stops the server (`pg_ctl stop -m fast`: sessions are ended, new connections refused).
    pub async fn stop(&self) -> io::Result<()> {
        let cmd = self.pg_ctl(&["stop", "-m", "fast", "-w"]);
        blocking(move || run_cmd(cmd, "pg_ctl stop")).await
    }

    /// Starts the stopped server again, on the same port and data.
    pub async fn restart(&self) -> io::Result<()> {
        let cmd = self.pg_ctl_start();
        blocking(move || run_cmd(cmd, "pg_ctl start")).await
    }

    /// What the server logged so far (for a failed test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn create(ssl: Option<(PathBuf, PathBuf)>) -> io::Result<PgCluster> {
        let bin = bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("samewise-test-pg")
            .tempdir()?;
        let as_postgres = owner_uid(dir.path())? == 0;
        let port = free_port()?;
        let cluster = PgCluster {
            dir,
            bin,
            port,
            as_postgres,
        };
        let data = cluster.data();
        std::fs::create_dir(&data)?;
        if as_postgres {
            let (uid, gid) = (id("-u")?, id("-g")?);
            std::os::unix::fs::chown(cluster.dir.path(), Some(uid), Some(gid))?;
            std::os::unix::fs::chown(&data, Some(uid), Some(gid))?;
        }
        let data_arg = data.display().to_string();
        let initdb = cluster.as_server(
            "initdb",
            &[
                "-D",
                &data_arg,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        run_cmd(initdb, "initdb")?;
        let mut conf = format!(
            "\n# samewise test cluster\nlisten_addresses = '127.0.0.1'\nport = {port}\n\
             unix_socket_directories = '{}'\nfsync = off\nmax_connections = 60\n",
            cluster.dir.path().display()
        );
        if let Some((cert, key)) = ssl {
            // the key must belong to the server's user and be private to it
            for (from, to) in [(&cert, "server.crt"), (&key, "server.key")] {
                let dest = data.join(to);
                std::fs::copy(from, &dest)?;
                std::fs::set_permissions(
                    &dest,
                    std::os::unix::fs::PermissionsExt::from_mode(0o600),
                )?;
                if as_postgres {
                    std::os::unix::fs::chown(&dest, Some(id("-u")?), Some(id("-g")?))?;
                }
            }
            conf.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
            )?;
        }
        let mut auto = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))?;
        io::Write::write_all(&mut auto, conf.as_bytes())?;
        run_cmd(cluster.pg_ctl_start(), "pg_ctl start")?;
        Ok(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn pg_ctl(&self, args: &[&str]) -> Command {
        let data = self.data().display().to_string();
        let mut all = vec!["-D", &data];
        all.extend(args);
        self.as_server("pg_ctl", &all)
    }

    fn pg_ctl_start(&self) -> Command {
        let log = self.dir.path().join("server.log").display().to_string();
        self.pg_ctl(&["start", "-w", "-t", "60", "-l", &log])
    }

    /// `bin/PROGRAM args`, as the `postgres` user when the test runs as root.
    fn as_server(&self, program: &str, args: &[&str]) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path).args(args);
            c
        } else {
            let mut c = Command::new(path);
            c.args(args);
            c
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // a stopped cluster answers "no server running": nothing to do then
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w"]).output();
    }
}

/// Runs blocking process work off the async runtime (a single-threaded test runtime keeps
/// serving its gateway meanwhile).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("the cluster task failed: {e}")))?
}

fn run_cmd(mut c: Command, what: &str) -> io::Result<()> {
    run(&mut c, what)
}

fn run(c: &mut Command, what: &str) -> io::Result<()> {
    let out = c
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{what}: cannot run: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// The PostgreSQL server binaries' directory.
fn bin_dir() -> io::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SAMEWISE_TEST_PG_BIN").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no PostgreSQL server binaries (initdb): set SAMEWISE_TEST_PG_BIN or install postgresql",
        )
    })
}

/// The owner of `path` (0 when this process runs as root and created it).
fn owner_uid(path: &Path) -> io::Result<u32> {
    Ok(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(
        path,
    )?))
}

/// `id FLAG postgres`: the postgres user's uid or gid.
fn id(flag: &str) -> io::Result<u32> {
    let out = Command::new("id").args([flag, "postgres"]).output()?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| {
            io::Error::other(
                "running as root, and there is no `postgres` user to run the server as",
            )
        })
}

/// A port on 127.0.0.1 nobody listens on now (the OS picks it; a race with another process
/// binding it before the server is possible but rare, and fails the start loudly).
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
