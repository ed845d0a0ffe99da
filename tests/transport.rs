//! The daemon's API client (`dra_scheduler::run::transport`) against the real API server:
//! requests in flight together share one HTTP/2 connection, where kube's own client
//! (HTTP/1.1) opens a connection, with its TLS handshake, for each. A plain `http://` URL
//! (`kubectl proxy`) is spoken to in HTTP/1.1.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
use kube::{Api, Client};
use test_cluster::{TestCluster, eventually, free_port};

/// This process's established TCP connections to `port` on this host: its sockets (from
/// /proc/self/fd) among /proc/net/tcp's and tcp6's entries in state 01 with that remote
/// port.
fn connections_to(port: u16) -> usize {
    let ours: HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .expect("list /proc/self/fd")
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            let inode = link.strip_prefix("socket:[")?.strip_suffix(']')?;
            Some(inode.to_string())
        })
        .collect();
    let remote_port = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| text.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode
            fields.len() > 9
                && fields[2].ends_with(&remote_port)
                && fields[3] == "01"
                && ours.contains(fields[9])
        })
        .count()
}

/// Lists namespaces `n` times at once through `client`.
async fn list_at_once(client: &Client, n: usize) {
    let api: Api<Namespace> = Api::all(client.clone());
    let params = ListParams::default();
    let lists = (0..n).map(|_| api.list(&params));
    for listed in futures::future::join_all(lists).await {
        listed.expect("namespaces listed");
    }
}

#[tokio::test]
async fn requests_in_flight_together_share_one_connection() {
    let cluster = TestCluster::shared();
    let config = cluster.config().await;
    let port = config
        .cluster_url
        .port_u16()
        .expect("the API server's port");
    let before = connections_to(port);

    let ours = dra_scheduler::run::transport::client(config.clone(), None).expect("client");
    list_at_once(&ours, 40).await;
    let with_ours = connections_to(port) - before;
    assert_eq!(
        with_ours, 1,
        "40 requests at once through the daemon's client: one HTTP/2 connection"
    );

    // kube's own client, for contrast (and to show the count sees connections): HTTP/1.1
    // opens more than one for the same requests.
    let theirs = Client::try_from(config).expect("kube's client");
    list_at_once(&theirs, 40).await;
    let with_theirs = connections_to(port) - before - with_ours;
    assert!(
        with_theirs > 1,
        "kube's HTTP/1.1 client used {with_theirs} connection(s) for 40 requests at once"
    );
}

/// A child process killed when the test ends, passed or not.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_plain_http_url_is_spoken_to_in_http_1_1() {
    let cluster = TestCluster::shared();
    let port = free_port();
    let _proxy = Killed(
        cluster
            .kubectl()
            .args([
                "proxy",
                "--address",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("kubectl proxy starts"),
    );
    eventually("kubectl proxy listening", 30, || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
    })
    .await;
    let url = format!("http://127.0.0.1:{port}").parse().expect("a URL");

    // The proxy's server speaks HTTP/1.1 only: an HTTP/2 preface there would fail each list.
    let ours = dra_scheduler::run::transport::client(kube::Config::new(url), None).expect("client");
    let before = connections_to(port);
    list_at_once(&ours, 10).await;
    let opened = connections_to(port) - before;
    assert!(
        opened > 1,
        "10 lists at once over HTTP/1.1 need connections of their own; {opened} stayed open"
    );
}
