//! The `fetch_url` tool: an HTTP GET of a host the operator allowed (`tools.fetch_url`), off
//! unless enabled.
//!
//! A host is allowed by name (`example.com`), by domain (`*.example.com`), or by `*`, which takes
//! any host whose addresses are all public: a page cannot make a worker reach its own network
//! through it. The public check is made by the client's own resolver, on the addresses it then
//! connects to, so a name cannot resolve to one address when checked and another when fetched.
//! Each redirect is checked the same way. At most `max_bytes` of the body are read;
//! text is returned as it is, anything else as a note saying what it was.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use hark_core::config::FetchUrlConfig;
use reqwest::Url;

/// The most redirects followed.
const MAX_REDIRECTS: usize = 5;

#[derive(Debug, Clone)]
pub struct Fetcher {
    config: FetchUrlConfig,
    http: reqwest::Client,
}

impl Fetcher {
    /// `None` when the tool is off.
    pub fn new(config: &FetchUrlConfig) -> Option<Self> {
        if !config.enabled {
            return None;
        }
        hark_core::install_crypto();
        let http = reqwest::Client::builder()
            .dns_resolver(Arc::new(Resolver {
                allow: config.allow.clone(),
            }))
            .redirect(reqwest::redirect::Policy::none())
            .timeout(config.timeout.0)
            .user_agent(concat!("hark/", env!("CARGO_PKG_VERSION")))
            .build()
            .ok()?;
        Some(Self {
            config: config.clone(),
            http,
        })
    }

    pub fn min_role(&self) -> hark_core::domain::Role {
        self.config.min_role
    }

    /// Fetches `url`; the text is what the model reads, an error starts with `error:`.
    pub async fn fetch(&self, url: &str) -> String {
        match self.get(url).await {
            Ok(text) => text,
            Err(e) => format!("error: {e}"),
        }
    }

    async fn get(&self, url: &str) -> Result<String, String> {
        let mut url = Url::parse(url.trim()).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
        for _ in 0..=MAX_REDIRECTS {
            self.check(&url)?;
            let mut response = self
                .http
                .get(url.clone())
                .send()
                .await
                .map_err(|e| format!("GET {url} failed: {}", without_url(&e)))?;
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .ok_or_else(|| format!("GET {url}: {status} without a Location"))?;
                url = url
                    .join(location)
                    .map_err(|e| format!("GET {url}: bad redirect `{location}`: {e}"))?;
                continue;
            }
            let kind = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|c| c.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let mut body: Vec<u8> = Vec::new();
            let mut cut = false;
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|e| format!("reading {url} failed: {}", without_url(&e)))?
            {
                let room = self.config.max_bytes as usize - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    cut = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            let texty = kind.is_empty()
                || kind.starts_with("text/")
                || kind.contains("json")
                || kind.contains("xml")
                || kind.contains("javascript");
            let mut text = if texty {
                String::from_utf8_lossy(&body).into_owned()
            } else {
                format!(
                    "[{} bytes of {kind}, which the model cannot read]",
                    body.len()
                )
            };
            if cut {
                text.push_str(&format!(
                    "\n[hark read only the first {} bytes (tools.fetch_url.max_bytes)]",
                    self.config.max_bytes
                ));
            }
            return Ok(format!("HTTP {} from {url}\n{text}", status.as_u16()));
        }
        Err(format!("{url}: more than {MAX_REDIRECTS} redirects"))
    }

    /// Whether `url` may be fetched: http or https, to an allowed host.
    fn check(&self, url: &Url) -> Result<(), String> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "only http and https can be fetched, not {}",
                url.scheme()
            ));
        }
        let host = url
            .host_str()
            .ok_or_else(|| format!("{url} has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        if named(&self.config.allow, &host) {
            return Ok(());
        }
        if !self.config.allow.iter().any(|p| p.trim() == "*") {
            return Err(format!(
                "{host} is not allowed (tools.fetch_url.allow); ask the operator, or do without it"
            ));
        }
        // A name is checked by the resolver when it is looked up; an address given as such, here.
        if let Ok(ip) = host.parse::<IpAddr>()
            && !public(&ip)
        {
            return Err(not_public(&host));
        }
        Ok(())
    }
}

/// Whether `host` is named in `allow`, itself or by its domain.
fn named(allow: &[String], host: &str) -> bool {
    allow.iter().any(|pattern| {
        let pattern = pattern.trim().to_ascii_lowercase();
        match pattern.strip_prefix("*.") {
            Some(domain) => host.ends_with(&format!(".{domain}")),
            None => pattern == host,
        }
    })
}

fn not_public(host: &str) -> String {
    format!("{host} is not a public address; only hosts named in tools.fetch_url.allow may be")
}

/// The client's resolver: a host not named in `allow` resolves only when every address it has is
/// public.
#[derive(Debug)]
struct Resolver {
    allow: Vec<String>,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let trusted = named(&self.allow, &host);
        Box::pin(async move {
            let addresses: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !trusted && (addresses.is_empty() || addresses.iter().any(|a| !public(&a.ip()))) {
                return Err(not_public(&host).into());
            }
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Whether an address is on the public internet.
fn public(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.octets()[0] == 100 && (64..128).contains(&v4.octets()[1]))
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| !public(&IpAddr::V4(v4))))
        }
    }
}

/// A reqwest error's message with its innermost cause, without the URL it repeats.
fn without_url(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out (tools.fetch_url.timeout)"
    } else if error.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause.and_then(std::error::Error::source) {
        cause = Some(inner);
    }
    match cause {
        Some(cause) => format!("{kind}: {cause}"),
        None => kind.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "169.254.1.1",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!public(&private.parse().expect("ip")), "{private}");
        }
        for open in ["1.1.1.1", "2606:4700::1111"] {
            assert!(public(&open.parse().expect("ip")), "{open}");
        }
    }

    #[tokio::test]
    async fn hosts_are_allowed_by_name_domain_or_as_public() {
        let fetcher = |allow: &[&str]| {
            Fetcher::new(&FetchUrlConfig {
                enabled: true,
                allow: allow.iter().map(|s| (*s).to_owned()).collect(),
                ..Default::default()
            })
            .expect("on")
        };
        let url = |u: &str| Url::parse(u).expect("url");
        let named = fetcher(&["example.com", "*.example.org"]);
        assert!(named.check(&url("https://example.com/x")).is_ok());
        assert!(named.check(&url("https://a.b.example.org/")).is_ok());
        assert!(named.check(&url("https://example.org/")).is_err());
        assert!(named.check(&url("https://evil.com/")).is_err());
        assert!(named.check(&url("file:///etc/passwd")).is_err());
        let any = fetcher(&["*"]);
        let err = any.check(&url("http://127.0.0.1:5432/")).unwrap_err();
        assert!(err.contains("not a public address"), "{err}");
        assert!(any.check(&url("http://[::1]/")).is_err());
        // A name is looked up by the client's resolver, whose addresses it then connects to.
        let err = any.fetch("http://localhost:9/").await;
        assert!(err.starts_with("error: GET http://localhost:9/ failed: cannot connect: localhost is not a public address"), "{err}");
        // Named, the same host resolves: the failure is then the closed port.
        let err = fetcher(&["localhost"]).fetch("http://localhost:9/").await;
        assert!(!err.contains("not a public address"), "{err}");
        assert!(
            Fetcher::new(&FetchUrlConfig::default()).is_none(),
            "off by default"
        );
    }
}
