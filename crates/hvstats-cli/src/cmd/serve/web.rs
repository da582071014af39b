//! `serve --web.config.file`: who may ask the exporter, in the web configuration file every
//! Prometheus exporter reads (the exporter toolkit's YAML: `tls_server_config`,
//! `http_server_config`, `basic_auth_users`, `rate_limit`), so one file serves node_exporter and
//! hvstats alike and `promtool check web-config` checks it.
//!
//! The file is read once, at start. Fields are the toolkit's, unknown ones refused as it refuses
//! them; what hvstats cannot do as the toolkit would is refused with the reason, never ignored:
//! client certificates accepted without a CA (`RequestClientCert`, `RequireAnyClientCert`),
//! `client_allowed_sans`, TLS 1.0 and 1.1, and the P-521 curve. HTTP/2 is not served
//! (`http2` is accepted; clients speak HTTP/1.1).
//!
//! Basic authentication compares bcrypt hashes one at a time on a blocking thread, as the toolkit
//! does; a user and password that matched are remembered (up to [`REMEMBERED`] of them), so a
//! scraper costs one bcrypt, and a flood of wrong passwords costs the attacker's connections one
//! comparison each, in turn, and no one else's. An unknown user is compared with a known user's
//! hash all the same, so the time of a refusal does not tell which users exist.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Users and passwords that matched, remembered so a scraper costs one bcrypt comparison.
const REMEMBERED: usize = 64;

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
    basic_auth_users: BTreeMap<String, String>,
    rate_limit: RateFile,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct TlsFile {
    cert: String,
    key: String,
    client_ca: String,
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
    headers: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct RateFile {
    interval: Option<String>,
    burst: Option<u64>,
}

/// Who may ask, and how they are answered, as the web configuration file says.
pub(crate) struct Web {
    tls: Option<TlsAcceptor>,
    auth: Option<Auth>,
    headers: Vec<(String, String)>,
    limiter: Option<Mutex<Bucket>>,
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
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let file: WebFile = serde_norway::from_str(&text)
            .with_context(|| format!("{} is not a web configuration file", path.display()))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let problem = |e: anyhow::Error| e.context(format!("in {}", path.display()));
        let headers = headers(&file.http_server_config.headers).map_err(problem)?;
        let tls = tls(&file.tls_server_config, &dir).map_err(problem)?;
        let auth = match file.basic_auth_users.is_empty() {
            true => None,
            false => Some(Auth::new(&file.basic_auth_users).map_err(problem)?),
        };
        let limiter = bucket(&file.rate_limit).map_err(problem)?.map(Mutex::new);
        let client_certificates = file.tls_server_config.client_auth_type == "RequireAndVerifyClientCert";
        let mut said = vec![match (&tls, client_certificates) {
            (Some(_), true) => "TLS with client certificates".to_owned(),
            (Some(_), false) => "TLS".to_owned(),
            (None, _) => "no TLS".to_owned(),
        }];
        said.push(match &auth {
            Some(a) => format!("basic authentication of {} user(s)", a.users.len()),
            None => "no authentication".to_owned(),
        });
        if limiter.is_some() {
            said.push("a rate limit".to_owned());
        }
        let tls = tls.map(|config| TlsAcceptor::from(Arc::new(config)));
        Ok(Self { tls, auth, headers, limiter, client_certificates, summary: said.join(", ") })
    }

    /// What the file asks, for the log: "TLS, basic authentication of 2 user(s)".
    pub(crate) fn summary(&self) -> &str {
        &self.summary
    }

    /// True when a client must authenticate (basic authentication, or a client certificate).
    pub(crate) fn authenticates(&self) -> bool {
        self.auth.is_some() || self.client_certificates
    }

    /// The TLS acceptor, when the file configures TLS.
    pub(crate) fn tls(&self) -> Option<&TlsAcceptor> {
        self.tls.as_ref()
    }

    /// The headers added to every response.
    pub(crate) fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Admits a request whose `Authorization` header is `authorization`, or says why not.
    ///
    /// # Errors
    /// Why the request is refused.
    pub(crate) async fn admit(&self, authorization: Option<&str>) -> Result<(), Refusal> {
        if let Some(limiter) = &self.limiter {
            let allowed = limiter.lock().map(|mut b| b.take()).unwrap_or(false);
            if !allowed {
                return Err(Refusal::RateLimited);
            }
        }
        match &self.auth {
            Some(auth) if !auth.check(authorization).await => Err(Refusal::Unauthorized),
            _ => Ok(()),
        }
    }
}

/// Why the web configuration refuses a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Past the rate limit (429).
    RateLimited,
    /// Without valid credentials (401, with a challenge).
    Unauthorized,
}

impl Refusal {
    /// The HTTP status of the refusal.
    pub(crate) fn status(self) -> u16 {
        match self {
            Refusal::RateLimited => 429,
            Refusal::Unauthorized => 401,
        }
    }

    /// The body of the refusal.
    pub(crate) fn text(self) -> &'static str {
        match self {
            Refusal::RateLimited => "Too Many Requests\n",
            Refusal::Unauthorized => "Unauthorized\n",
        }
    }
}

fn headers(configured: &BTreeMap<String, String>) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (name, value) in configured {
        let Some((_, allowed)) = HEADERS.iter().find(|(n, _)| n == name) else {
            bail!("HTTP header {name:?} can not be configured");
        };
        if !allowed.is_empty() && !allowed.contains(&value.as_str()) {
            bail!("invalid value for {name}. Expected one of: {allowed:?}, but got: {value:?}");
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

/// PEM text given inline, or read from a file.
fn pem(inline: &str, file: &str, dir: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    match file.is_empty() {
        true => Ok(inline.as_bytes().to_vec()),
        false => {
            let path = file_in(dir, file);
            std::fs::read(&path).with_context(|| format!("failed to read {what} ({})", path.display()))
        }
    }
}

fn tls(t: &TlsFile, dir: &Path) -> anyhow::Result<Option<rustls::ServerConfig>> {
    let enabled =
        [&t.cert, &t.key, &t.client_ca, &t.cert_file, &t.key_file, &t.client_ca_file, &t.client_auth_type]
            .iter()
            .any(|s| !s.is_empty());
    if !enabled {
        if t.client_allowed_sans.is_some() || !t.cipher_suites.is_empty() || !t.curve_preferences.is_empty() {
            bail!("tls_server_config sets TLS options without a certificate");
        }
        return Ok(None);
    }
    if t.cert.is_empty() && t.cert_file.is_empty() {
        bail!("missing one of cert or cert_file");
    }
    if t.key.is_empty() && t.key_file.is_empty() {
        bail!("missing one of key or key_file");
    }
    if t.client_allowed_sans.is_some() {
        bail!(
            "client_allowed_sans is not supported by hvstats: issue client certificates from a CA of their own"
        );
    }
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&pem(&t.cert, &t.cert_file, dir, "cert_file")?)
            .collect::<Result<_, _>>()
            .context("the certificate is not PEM")?;
    if certs.is_empty() {
        bail!("no certificate in cert or cert_file");
    }
    let key = PrivateKeyDer::from_pem_slice(&pem(&t.key, &t.key_file, dir, "key_file")?)
        .context("the key is not a PEM private key")?;
    let mut provider = rustls::crypto::ring::default_provider();
    if !t.cipher_suites.is_empty() {
        // The toolkit's list applies to TLS 1.2; TLS 1.3 keeps its own suites.
        let mut suites: Vec<rustls::SupportedCipherSuite> =
            provider.cipher_suites.iter().filter(|s| s.tls13().is_some()).copied().collect();
        for name in &t.cipher_suites {
            let found = provider.cipher_suites.iter().find(|s| format!("{:?}", s.suite()) == *name);
            match found {
                Some(s) => suites.push(*s),
                None => bail!(
                    "cipher suite {name:?} is not one hvstats offers (it offers {})",
                    provider
                        .cipher_suites
                        .iter()
                        .filter(|s| s.tls13().is_none())
                        .map(|s| format!("{:?}", s.suite()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
        provider.cipher_suites = suites;
    }
    if !t.curve_preferences.is_empty() {
        let all = provider.kx_groups.clone();
        let mut groups = Vec::new();
        for curve in &t.curve_preferences {
            let named = match curve.as_str() {
                "CurveP256" => rustls::NamedGroup::secp256r1,
                "CurveP384" => rustls::NamedGroup::secp384r1,
                "X25519" => rustls::NamedGroup::X25519,
                "CurveP521" => bail!("curve CurveP521 is not supported by hvstats"),
                other => bail!("unknown curve: {other}"),
            };
            groups.extend(all.iter().filter(|g| g.name() == named).copied());
        }
        provider.kx_groups = groups;
    }
    let version = |v: &Option<String>, default: u8| -> anyhow::Result<u8> {
        match v.as_deref() {
            None => Ok(default),
            Some("TLS13") => Ok(13),
            Some("TLS12") => Ok(12),
            Some(old @ ("TLS10" | "TLS11")) => {
                bail!("{old} is not supported by hvstats (TLS12 and TLS13 are)")
            }
            Some(other) => bail!("unknown TLS version: {other}"),
        }
    };
    let (min, max) = (version(&t.min_version, 12)?, version(&t.max_version, 13)?);
    if min > max {
        bail!("min_version is above max_version");
    }
    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (min..=max).contains(v))
            .map(|(_, p)| p)
            .collect();
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&versions)
        .context("the TLS versions and cipher suites have nothing in common")?;
    let client_ca = pem(&t.client_ca, &t.client_ca_file, dir, "client_ca_file")?;
    let verifier = |optional: bool| -> anyhow::Result<Arc<dyn rustls::server::danger::ClientCertVerifier>> {
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&client_ca) {
            roots
                .add(ca.context("the client CA is not PEM")?)
                .context("the client CA is not a CA certificate")?;
        }
        if roots.is_empty() {
            bail!("no certificate in client_ca or client_ca_file");
        }
        let builder = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots));
        let builder = if optional { builder.allow_unauthenticated() } else { builder };
        Ok(builder.build()?)
    };
    let builder = match t.client_auth_type.as_str() {
        "" | "NoClientCert" => {
            if !client_ca.is_empty() {
                bail!("client CA's have been configured without a Client Auth Policy");
            }
            builder.with_no_client_auth()
        }
        "VerifyClientCertIfGiven" => builder.with_client_cert_verifier(verifier(true)?),
        "RequireAndVerifyClientCert" => builder.with_client_cert_verifier(verifier(false)?),
        unverified @ ("RequestClientCert" | "RequireAnyClientCert" | "RequireClientCert") => bail!(
            "client_auth_type {unverified} accepts certificates no CA signed: not supported by hvstats \
             (RequireAndVerifyClientCert is)"
        ),
        other => bail!("invalid ClientAuth: {other}"),
    };
    let mut config = builder.with_single_cert(certs, key).context("failed to load X509KeyPair")?;
    config.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(config))
}

/// Basic authentication against bcrypt hashes.
struct Auth {
    users: HashMap<String, String>,
    /// A hash compared with for an unknown user (one of the real ones: the same cost).
    decoy: String,
    matched: Mutex<HashSet<(String, String)>>,
    /// One bcrypt comparison at a time.
    turn: Semaphore,
}

impl Auth {
    fn new(users: &BTreeMap<String, String>) -> anyhow::Result<Self> {
        for (user, hash) in users {
            if hash.parse::<bcrypt::HashParts>().is_err() {
                bail!("the password of user {user:?} is not a bcrypt hash");
            }
        }
        let decoy = users.values().next().cloned().unwrap_or_default();
        Ok(Self {
            users: users.clone().into_iter().collect(),
            decoy,
            matched: Mutex::new(HashSet::new()),
            turn: Semaphore::new(1),
        })
    }

    async fn check(&self, authorization: Option<&str>) -> bool {
        let Some((user, password)) = authorization.and_then(credentials) else { return false };
        let known = self.users.get(&user);
        let remembered = |m: &HashSet<(String, String)>| m.contains(&(user.clone(), password.clone()));
        if known.is_some() && self.matched.lock().is_ok_and(|m| remembered(&m)) {
            return true;
        }
        let Ok(_turn) = self.turn.acquire().await else { return false };
        let hash = known.unwrap_or(&self.decoy).clone();
        let given = password.clone();
        let matches = tokio::task::spawn_blocking(move || bcrypt::verify(given, &hash).unwrap_or(false))
            .await
            .unwrap_or(false);
        let ok = matches && known.is_some();
        if ok && let Ok(mut m) = self.matched.lock() {
            if m.len() >= REMEMBERED {
                m.clear();
            }
            m.insert((user, password));
        }
        ok
    }
}

/// The user and password of a `Basic` authorization.
fn credentials(header: &str) -> Option<(String, String)> {
    let (scheme, encoded) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// A token bucket: `burst` requests at once, then one per `interval`.
struct Bucket {
    interval: Duration,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self) -> bool {
        let now = Instant::now();
        let earned = now.duration_since(self.at).as_secs_f64() / self.interval.as_secs_f64();
        self.tokens = (self.tokens + earned).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return true;
        }
        false
    }
}

fn bucket(r: &RateFile) -> anyhow::Result<Option<Bucket>> {
    let interval = match r.interval.as_deref() {
        None => return Ok(None),
        Some(text) => go_duration(text)?,
    };
    if interval.is_zero() {
        return Ok(None);
    }
    let burst = r.burst.unwrap_or(0) as f64;
    Ok(Some(Bucket { interval, burst, tokens: burst, at: Instant::now() }))
}

/// A duration as Prometheus' configuration writes them: `1h30m`, `15s`, `100ms`, `0`.
fn go_duration(text: &str) -> anyhow::Result<Duration> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let n: u64 = number.parse().with_context(|| format!("not a duration: {text:?}"))?;
        let unit = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit);
        let one = match unit {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86_400),
            "w" => Duration::from_secs(7 * 86_400),
            "y" => Duration::from_secs(365 * 86_400),
            _ => bail!("not a duration: {text:?}"),
        };
        total += one * u32::try_from(n).with_context(|| format!("not a duration: {text:?}"))?;
        rest = tail;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_credentials_read_as_the_toolkit_writes_them() {
        assert_eq!(go_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(go_duration("100ms").unwrap(), Duration::from_millis(100));
        assert!(go_duration("5 parsecs").is_err());
        assert_eq!(credentials("Basic YWxpY2U6cGE6c3M="), Some(("alice".into(), "pa:ss".into())));
        assert_eq!(credentials("Bearer x"), None);
    }
}
