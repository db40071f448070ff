//! HTTPS on the same listener, with certificates made in the test (rcgen): a real handshake, a
//! certificate reload that takes effect for new connections, mTLS that refuses a client without
//! a certificate, and a handshake that never comes is cut off.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use reqwest::StatusCode;
use tokio::io::AsyncReadExt;
use ttlwheel::config::Config;

use crate::server::TestServer;

/// A CA, and PEMs of a certificate it signed for `127.0.0.1`.
struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Authority {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// `(certificate PEM, key PEM)` for `names`.
    fn sign(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        let params = CertificateParams::new(names).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ttlwheel-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(path: &Path, text: &str) {
    // Write then rename, as a certificate manager would: never a half-written file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn https_server(dir: &Path, client_ca: Option<&Path>) -> (TestServer, String) {
    let mut config = Config::ephemeral();
    config.tls_cert = Some(dir.join("cert.pem"));
    config.tls_key = Some(dir.join("key.pem"));
    config.tls_client_ca = client_ca.map(Path::to_owned);
    config.tls_handshake_timeout = Duration::from_secs(1);
    let server = TestServer::with_config(config).await;
    let base = server.base.replace("http://", "https://");
    (server, base)
}

fn client_trusting(ca_pem: &str, identity: Option<(&str, &str)>) -> reqwest::Client {
    ttlwheel::notify::install_tls_provider();
    let mut builder = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()])
        .timeout(Duration::from_secs(5));
    if let Some((cert, key)) = identity {
        let pem = format!("{cert}{key}");
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    builder.build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_and_a_new_certificate_takes_effect_for_new_connections() {
    let dir = dir("reload");
    let (first_ca, second_ca) = (Authority::new("first"), Authority::new("second"));
    let (cert, key) = first_ca.sign(&["127.0.0.1", "localhost"]);
    write(&dir.join("cert.pem"), &cert);
    write(&dir.join("key.pem"), &key);
    let (server, base) = https_server(&dir, None).await;
    let trusts_first = client_trusting(&first_ca.pem(), None);
    let answer = trusts_first
        .get(format!("{base}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    // Plain HTTP on the TLS port is not served.
    assert!(server
        .client
        .get(server.url("/healthz"))
        .send()
        .await
        .is_err());

    // The certificate is replaced by one from another CA: new connections get it.
    let (cert, key) = second_ca.sign(&["127.0.0.1", "localhost"]);
    write(&dir.join("key.pem"), &key);
    write(&dir.join("cert.pem"), &cert);
    let trusts_second = client_trusting(&second_ca.pem(), None);
    let mut reloaded = false;
    for _ in 0..100 {
        let fresh = client_trusting(&second_ca.pem(), None);
        if fresh.get(format!("{base}/healthz")).send().await.is_ok() {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reloaded, "the new certificate never took effect");
    let answer = trusts_second
        .get(format!("{base}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let stale = client_trusting(&first_ca.pem(), None);
    assert!(
        stale.get(format!("{base}/healthz")).send().await.is_err(),
        "the old certificate is gone"
    );
    // A broken file on reload keeps the certificate in force.
    write(&dir.join("cert.pem"), "not a certificate");
    tokio::time::sleep(ttlwheel::edge::tls::RELOAD_CHECK * 2).await;
    let fresh = client_trusting(&second_ca.pem(), None);
    assert_eq!(
        fresh
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_refuses_a_client_without_a_certificate_and_serves_one_with() {
    let dir = dir("mtls");
    let (server_ca, client_ca) = (Authority::new("servers"), Authority::new("clients"));
    let (cert, key) = server_ca.sign(&["127.0.0.1"]);
    write(&dir.join("cert.pem"), &cert);
    write(&dir.join("key.pem"), &key);
    write(&dir.join("clients.pem"), &client_ca.pem());
    let (server, base) = https_server(&dir, Some(&dir.join("clients.pem"))).await;
    let anonymous = client_trusting(&server_ca.pem(), None);
    assert!(
        anonymous
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_err(),
        "no certificate: refused"
    );
    let (client_cert, client_key) = client_ca.sign(&["client-1"]);
    let known = client_trusting(&server_ca.pem(), Some((&client_cert, &client_key)));
    let answer = known.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    // A certificate from another CA is refused too.
    let (stranger_cert, stranger_key) = Authority::new("elsewhere").sign(&["stranger"]);
    let stranger = client_trusting(&server_ca.pem(), Some((&stranger_cert, &stranger_key)));
    assert!(stranger
        .get(format!("{base}/healthz"))
        .send()
        .await
        .is_err());
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_never_comes_is_cut_off() {
    let dir = dir("handshake");
    let ca = Authority::new("ca");
    let (cert, key) = ca.sign(&["127.0.0.1"]);
    write(&dir.join("cert.pem"), &cert);
    write(&dir.join("key.pem"), &key);
    let (server, _) = https_server(&dir, None).await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let mut silent = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut buffer = [0u8; 64];
    // The timeout is 1 s: the server closes it (generous patience for a loaded machine).
    let read = tokio::time::timeout(Duration::from_secs(20), silent.read(&mut buffer)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "still open: {read:?}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}
