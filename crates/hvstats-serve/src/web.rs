//! `serve --web.config.file`: who may ask the exporter, in the web configuration file every
//! Prometheus exporter reads (the exporter toolkit's YAML: `tls_server_config`,
//! `http_server_config`, `basic_auth_users`), so one file serves node_exporter and
//! hvstats alike and `promtool check web-config` checks it.
//!
//! The file is read once, at start. Fields are the toolkit's, unknown ones refused as it refuses
//! them; what hvstats cannot do as the toolkit would is refused with the reason, never ignored:
//! client certificates accepted without a CA (`RequestClientCert`, `RequireAnyClientCert`),
//! `client_allowed_sans`, TLS 1.0 and 1.1, and the P-521 curve. HTTP/2 is not served
//! (`http2` is accepted; clients speak HTTP/1.1). What `promtool check web-config` refuses is
//! refused too, with the reason: the newer toolkit's `rate_limit` (one bucket for every client, so
//! one client's requests would use up everyone's; the server bounds each client instead) and
//! certificates and keys given inline (`cert`, `key`, `client_ca`; name files instead).
//!
//! Basic authentication is [`crate::auth`]'s: bcrypt comparisons that cost only the client who
//! fails them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::auth::{Auth, Verdict};
use crate::problem::{Because, Problem, refuse};

/// The headers the toolkit lets a file add, with the values it accepts (empty: any).
const HEADERS: [(&str, &[&str]); 5] = [
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct WebFile {
    tls_server_config: TlsFile,
    http_server_config: HttpFile,
    #[serde(deserialize_with = "unique_keys")]
    basic_auth_users: BTreeMap<String, String>,
    /// Refused when present (see the module documentation).
    rate_limit: Option<serde_norway::Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct TlsFile {
    /// Refused when present (see the module documentation), as the three below.
    cert: Option<serde_norway::Value>,
    key: Option<serde_norway::Value>,
    client_ca: Option<serde_norway::Value>,
    cert_file: String,
    key_file: String,
    client_auth_type: String,
    client_ca_file: String,
    client_allowed_sans: Option<Vec<String>>,
    min_version: Option<String>,
    max_version: Option<String>,
    cipher_suites: Vec<String>,
    prefer_server_cipher_suites: Option<bool>,
    curve_preferences: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct HttpFile {
    #[allow(dead_code, reason = "accepted as the toolkit reads it; HTTP/2 is not served")]
    http2: Option<bool>,
    #[serde(deserialize_with = "unique_keys")]
    headers: BTreeMap<String, String>,
}

/// A map whose keys are given once each (the toolkit refuses a user or header given twice; a
/// plain map would keep the last silently).
fn unique_keys<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = BTreeMap<String, String>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of strings")
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((key, value)) = map.next_entry::<String, String>()? {
                if out.contains_key(&key) {
                    return Err(serde::de::Error::custom(format!("duplicate key {key:?}")));
                }
                out.insert(key, value);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Unique)
}

/// Why a web configuration file is refused.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    /// The file cannot be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not the toolkit's schema.
    #[error("{} is not a web configuration file", path.display())]
    Schema {
        /// The file.
        path: PathBuf,
        /// Where and why.
        #[source]
        source: serde_norway::Error,
    },
    /// The file asks what hvstats cannot do, or names what cannot be used (see the module
    /// documentation).
    #[error("in {}", path.display())]
    Refused {
        /// The file.
        path: PathBuf,
        /// What it asks, and why not.
        #[source]
        problem: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Who may ask, and how they are answered, as the web configuration file says.
pub struct Web {
    tls: Option<TlsAcceptor>,
    auth: Option<Auth>,
    headers: Vec<(String, String)>,
    client_certificates: bool,
    summary: String,
}

impl Web {
    /// Reads and checks the web configuration file `path` (relative files in it are relative to
    /// its directory, as the toolkit has them).
    ///
    /// # Errors
    /// When it cannot be read, is not the toolkit's schema, names files that cannot be read or a
    /// key that does not match its certificate, or asks what hvstats cannot do (see the module
    /// documentation).
    pub fn load(path: &Path) -> Result<Self, WebConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| WebConfigError::Read { path: path.to_owned(), source })?;
        let file: WebFile = serde_norway::from_str(&text)
            .map_err(|source| WebConfigError::Schema { path: path.to_owned(), source })?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let problem = |e: Problem| WebConfigError::Refused { path: path.to_owned(), problem: Box::new(e) };
        refused(&file).map_err(problem)?;
        let headers = headers(&file.http_server_config.headers).map_err(problem)?;
        let tls = tls(&file.tls_server_config, &dir).map_err(problem)?;
        let auth = match file.basic_auth_users.is_empty() {
            true => None,
            false => Some(Auth::new(&file.basic_auth_users).map_err(problem)?),
        };
        let client_certificates = file.tls_server_config.client_auth_type == "RequireAndVerifyClientCert";
        let mut said = vec![match (&tls, client_certificates) {
            (Some(_), true) => "TLS with client certificates".to_owned(),
            (Some(_), false) => "TLS".to_owned(),
            (None, _) => "no TLS".to_owned(),
        }];
        said.push(match &auth {
            Some(a) => format!("basic authentication of {} user(s)", a.users()),
            None => "no authentication".to_owned(),
        });
        let tls = tls.map(|config| TlsAcceptor::from(Arc::new(config)));
        Ok(Self { tls, auth, headers, client_certificates, summary: said.join(", ") })
    }

    /// What the file asks, for the log: "TLS, basic authentication of 2 user(s)".
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// True when a client must authenticate (basic authentication, or a client certificate).
    pub fn authenticates(&self) -> bool {
        self.auth.is_some() || self.client_certificates
    }

    /// True when the file configures TLS.
    pub fn serves_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The TLS acceptor, when the file configures TLS.
    pub(crate) fn tls(&self) -> Option<&TlsAcceptor> {
        self.tls.as_ref()
    }

    /// The headers added to every response.
    pub(crate) fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Admits a request from `source` whose `Authorization` header is `authorization`, or says
    /// why not.
    ///
    /// # Errors
    /// Why the request is refused.
    pub(crate) async fn admit(
        &self,
        authorization: Option<&str>,
        source: Option<IpAddr>,
    ) -> Result<(), Refusal> {
        match &self.auth {
            Some(auth) => match auth.check(authorization, source).await {
                Verdict::Admitted => Ok(()),
                Verdict::Refused => Err(Refusal::Unauthorized),
                Verdict::Busy => Err(Refusal::Busy),
            },
            None => Ok(()),
        }
    }
}

/// Why the web configuration refuses a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The client's address has as many password checks under way as it may (429).
    Busy,
    /// Without valid credentials (401, with a challenge).
    Unauthorized,
}

impl Refusal {
    /// The HTTP status of the refusal.
    pub(crate) fn status(self) -> u16 {
        match self {
            Refusal::Busy => 429,
            Refusal::Unauthorized => 401,
        }
    }

    /// The body of the refusal.
    pub(crate) fn text(self) -> &'static str {
        match self {
            Refusal::Busy => "Too Many Requests: this address has password checks under way\n",
            Refusal::Unauthorized => "Unauthorized\n",
        }
    }
}

/// Refuses what `promtool check web-config` refuses and the newer toolkit would take.
fn refused(file: &WebFile) -> Result<(), Problem> {
    if file.rate_limit.is_some() {
        refuse!(
            "rate_limit is not supported by hvstats: it is one limit for every client, so one client's \
             requests would use up everyone's (promtool check web-config refuses it too); the server \
             bounds each client's connections and password checks instead"
        );
    }
    let t = &file.tls_server_config;
    for (inline, file) in [(&t.cert, "cert_file"), (&t.key, "key_file"), (&t.client_ca, "client_ca_file")] {
        if inline.is_some() {
            let name = file.trim_end_matches("_file");
            refuse!(
                "{name} given inline is not supported by hvstats (promtool check web-config refuses it too): use {file}"
            );
        }
    }
    Ok(())
}

fn headers(configured: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, Problem> {
    let mut out = Vec::new();
    for (name, value) in configured {
        let Some((_, allowed)) = HEADERS.iter().find(|(n, _)| n == name) else {
            refuse!("HTTP header {name:?} can not be configured");
        };
        if !allowed.is_empty() && !allowed.contains(&value.as_str()) {
            refuse!("invalid value for {name}. Expected one of: {allowed:?}, but got: {value:?}");
        }
        if !value.is_empty() {
            out.push((name.clone(), value.clone()));
        }
    }
    Ok(out)
}

/// A file named in the configuration: relative to its directory.
fn file_in(dir: &Path, name: &str) -> PathBuf {
    match Path::new(name).is_absolute() {
        true => PathBuf::from(name),
        false => dir.join(name),
    }
}

/// PEM text read from a file (none when no file is named).
fn pem(file: &str, dir: &Path, what: &str) -> Result<Vec<u8>, Problem> {
    match file.is_empty() {
        true => Ok(Vec::new()),
        false => {
            let path = file_in(dir, file);
            std::fs::read(&path).because(format!("failed to read {what} ({})", path.display()))
        }
    }
}

/// The TLS server configuration the file asks for, none when it asks for no TLS.
fn tls(t: &TlsFile, dir: &Path) -> Result<Option<rustls::ServerConfig>, Problem> {
    if !tls_asked(t)? {
        return Ok(None);
    }
    let (certs, key) = certificate(t, dir)?;
    let provider = crypto_provider(t)?;
    let versions = versions(t)?;
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&versions)
        .because("the TLS versions and cipher suites have nothing in common")?;
    let client_ca = pem(&t.client_ca_file, dir, "client_ca_file")?;
    let builder = match client_verifier(&t.client_auth_type, &client_ca)? {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).because("failed to load X509KeyPair")?;
    config.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(config))
}

/// Whether the file asks for TLS (a certificate, a key, a client CA or a client policy); what
/// TLS needs, when it does: a certificate and its key.
fn tls_asked(t: &TlsFile) -> Result<bool, Problem> {
    let asked =
        [&t.cert_file, &t.key_file, &t.client_ca_file, &t.client_auth_type].iter().any(|s| !s.is_empty());
    if !asked {
        if t.client_allowed_sans.is_some() || !t.cipher_suites.is_empty() || !t.curve_preferences.is_empty() {
            refuse!("tls_server_config sets TLS options without a certificate");
        }
        return Ok(false);
    }
    if t.cert_file.is_empty() {
        refuse!("missing cert_file");
    }
    if t.key_file.is_empty() {
        refuse!("missing key_file");
    }
    if t.client_allowed_sans.is_some() {
        refuse!(
            "client_allowed_sans is not supported by hvstats: issue client certificates from a CA of their own"
        );
    }
    Ok(true)
}

/// The certificate chain of `cert_file` and the key of `key_file`.
fn certificate(
    t: &TlsFile,
    dir: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Problem> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&pem(&t.cert_file, dir, "cert_file")?)
            .collect::<Result<_, _>>()
            .because("the certificate is not PEM")?;
    if certs.is_empty() {
        refuse!("no certificate in cert_file");
    }
    let key = PrivateKeyDer::from_pem_slice(&pem(&t.key_file, dir, "key_file")?)
        .because("the key is not a PEM private key")?;
    Ok((certs, key))
}

/// ring's cryptography, narrowed to the file's `cipher_suites` and `curve_preferences`.
fn crypto_provider(t: &TlsFile) -> Result<rustls::crypto::CryptoProvider, Problem> {
    let mut provider = rustls::crypto::ring::default_provider();
    if !t.cipher_suites.is_empty() {
        provider.cipher_suites = cipher_suites(&provider.cipher_suites, &t.cipher_suites)?;
    }
    if !t.curve_preferences.is_empty() {
        let all = provider.kx_groups.clone();
        let mut groups = Vec::new();
        for curve in &t.curve_preferences {
            let named = match curve.as_str() {
                "CurveP256" => rustls::NamedGroup::secp256r1,
                "CurveP384" => rustls::NamedGroup::secp384r1,
                "X25519" => rustls::NamedGroup::X25519,
                "CurveP521" => refuse!("curve CurveP521 is not supported by hvstats"),
                other => refuse!("unknown curve: {other}"),
            };
            groups.extend(all.iter().filter(|g| g.name() == named).copied());
        }
        provider.kx_groups = groups;
    }
    Ok(provider)
}

/// The suites of `offered` the toolkit's list `named` keeps. The list applies to TLS 1.2; TLS 1.3
/// keeps its own suites.
fn cipher_suites(
    offered: &[rustls::SupportedCipherSuite],
    named: &[String],
) -> Result<Vec<rustls::SupportedCipherSuite>, Problem> {
    let mut suites: Vec<rustls::SupportedCipherSuite> =
        offered.iter().filter(|s| s.tls13().is_some()).copied().collect();
    for name in named {
        match offered.iter().find(|s| format!("{:?}", s.suite()) == *name) {
            Some(s) => suites.push(*s),
            None => refuse!(
                "cipher suite {name:?} is not one hvstats offers (it offers {})",
                offered
                    .iter()
                    .filter(|s| s.tls13().is_none())
                    .map(|s| format!("{:?}", s.suite()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    Ok(suites)
}

/// The TLS versions from `min_version` (TLS 1.2 by default) to `max_version` (TLS 1.3).
fn versions(t: &TlsFile) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, Problem> {
    let version = |v: &Option<String>, default: u8| -> Result<u8, Problem> {
        match v.as_deref() {
            None => Ok(default),
            Some("TLS13") => Ok(13),
            Some("TLS12") => Ok(12),
            Some(old @ ("TLS10" | "TLS11")) => {
                refuse!("{old} is not supported by hvstats (TLS12 and TLS13 are)")
            }
            Some(other) => refuse!("unknown TLS version: {other}"),
        }
    };
    let (min, max) = (version(&t.min_version, 12)?, version(&t.max_version, 13)?);
    if min > max {
        refuse!("min_version is above max_version");
    }
    Ok([(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
        .into_iter()
        .filter(|(v, _)| (min..=max).contains(v))
        .map(|(_, p)| p)
        .collect())
}

/// The verifier of client certificates `client_auth_type` asks for, against the CA certificates
/// of `client_ca` (PEM); none when no client certificate is asked for.
fn client_verifier(
    client_auth_type: &str,
    client_ca: &[u8],
) -> Result<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>, Problem> {
    let optional = match client_auth_type {
        "" | "NoClientCert" => {
            if !client_ca.is_empty() {
                refuse!("client CA's have been configured without a Client Auth Policy");
            }
            return Ok(None);
        }
        "VerifyClientCertIfGiven" => true,
        "RequireAndVerifyClientCert" => false,
        unverified @ ("RequestClientCert" | "RequireAnyClientCert" | "RequireClientCert") => refuse!(
            "client_auth_type {unverified} accepts certificates no CA signed: not supported by hvstats \
             (RequireAndVerifyClientCert is)"
        ),
        other => refuse!("invalid ClientAuth: {other}"),
    };
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(client_ca) {
        roots
            .add(ca.because("the client CA is not PEM")?)
            .because("the client CA is not a CA certificate")?;
    }
    if roots.is_empty() {
        refuse!("no certificate in client_ca_file");
    }
    let builder = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots));
    let builder = if optional { builder.allow_unauthenticated() } else { builder };
    Ok(Some(builder.build().map_err(|e| Problem::new(e.to_string()))?))
}
