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
        // The environment's proxies are never used: a proxy resolves names itself, past the
        // resolver below. Only the configured one is, with each target checked first.
        let mut http = reqwest::Client::builder().no_proxy();
        if !config.proxy.trim().is_empty() {
            match reqwest::Proxy::all(config.proxy.trim()) {
                Ok(proxy) => http = http.proxy(proxy),
                Err(e) => {
                    tracing::error!(
                        error = %e,
                        "tools.fetch_url.proxy is not a proxy URL; fetch_url is off"
                    );
                    return None;
                }
            }
        }
        let http = http
            .dns_resolver(Arc::new(Resolver {
                allow_private: config.allow_private.clone(),
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
            if !self.config.proxy.trim().is_empty() {
                self.check_addresses(&url).await?;
            }
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
        let host = host_of(url)?;
        if !named(&self.config.allow, &host) && !self.config.allow.iter().any(|p| p.trim() == "*") {
            return Err(format!(
                "{host} is not allowed (tools.fetch_url.allow); ask the operator, or do without it"
            ));
        }
        // A name is checked by the resolver when it is looked up; an address given as such, here.
        if let Ok(ip) = host.parse::<IpAddr>()
            && !public(&ip)
            && !named(&self.config.allow_private, &host)
        {
            return Err(not_public(&host));
        }
        Ok(())
    }

    /// Through a proxy, which resolves the name itself: the target's addresses, checked here.
    async fn check_addresses(&self, url: &Url) -> Result<(), String> {
        let host = host_of(url)?;
        if named(&self.config.allow_private, &host) {
            return Ok(());
        }
        let port = url.port_or_known_default().unwrap_or(80);
        let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("cannot look up {host}: {e}"))?
            .collect();
        if addresses.is_empty() || addresses.iter().any(|a| !public(&a.ip())) {
            return Err(not_public(&host));
        }
        Ok(())
    }
}

/// The host of `url` as `allow` names it: lower case, an IPv6 address without its brackets.
fn host_of(url: &Url) -> Result<String, String> {
    Ok(url
        .host_str()
        .ok_or_else(|| format!("{url} has no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase())
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
    format!(
        "{host} is not a public address; only hosts named in tools.fetch_url.allow_private may be"
    )
}

/// The client's resolver: a host not named in `allow_private` resolves only when every address
/// it has is public.
#[derive(Debug)]
struct Resolver {
    allow_private: Vec<String>,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let trusted = named(&self.allow_private, &host);
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

/// Whether an address is on the public internet: in none of the blocks of IANA's IPv4 and
/// IPv6 special-purpose address registries that are not globally reachable, nor multicast.
fn public(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => public_v4(u32::from(*v4)),
        IpAddr::V6(v6) => public_v6(u128::from(*v6)),
    }
}

fn in_block(address: u128, bits: u32, prefix: u128, len: u32) -> bool {
    len == 0 || (address >> (bits - len)) == (prefix >> (bits - len))
}

fn public_v4(a: u32) -> bool {
    const BLOCKS: [(u32, u32); 17] = [
        (0x0000_0000, 8),  // 0.0.0.0/8 "this network"
        (0x0A00_0000, 8),  // 10.0.0.0/8 private
        (0x6440_0000, 10), // 100.64.0.0/10 shared (carrier-grade NAT)
        (0x7F00_0000, 8),  // 127.0.0.0/8 loopback
        (0xA9FE_0000, 16), // 169.254.0.0/16 link-local
        (0xAC10_0000, 12), // 172.16.0.0/12 private
        (0xC000_0000, 24), // 192.0.0.0/24 IETF protocol assignments
        (0xC000_0200, 24), // 192.0.2.0/24 documentation
        (0xC01F_C400, 24), // 192.31.196.0/24 AS112
        (0xC034_C100, 24), // 192.52.193.0/24 AMT
        (0xC058_6300, 24), // 192.88.99.0/24 6to4 relay anycast
        (0xC0A8_0000, 16), // 192.168.0.0/16 private
        (0xC0AF_3000, 24), // 192.175.48.0/24 direct delegation AS112
        (0xC612_0000, 15), // 198.18.0.0/15 benchmarking
        (0xC633_6400, 24), // 198.51.100.0/24 documentation
        (0xCB00_7100, 24), // 203.0.113.0/24 documentation
        (0xE000_0000, 3),  // 224.0.0.0/4 multicast and 240.0.0.0/4 reserved (broadcast too)
    ];
    !BLOCKS
        .iter()
        .any(|&(prefix, len)| in_block(a.into(), 32, prefix.into(), len))
}

fn public_v6(a: u128) -> bool {
    // An IPv4-mapped address is what its IPv4 address is.
    if a >> 32 == 0xffff {
        return public_v4(a as u32);
    }
    const BLOCKS: [(u128, u32); 13] = [
        (0, 96),                      // ::/96 unspecified, loopback, IPv4-compatible
        (0x0064_ff9b << 96, 96),      // 64:ff9b::/96 IPv4/IPv6 translation
        (0x0064_ff9b_0001 << 80, 48), // 64:ff9b:1::/48 local translation
        (0x0100 << 112, 64),          // 100::/64 discard-only
        (0x2001 << 112, 23),          // 2001::/23 IETF protocol assignments
        (0x2001_0db8 << 96, 32),      // 2001:db8::/32 documentation
        (0x2002 << 112, 16),          // 2002::/16 6to4
        (0x3fff << 112, 20),          // 3fff::/20 documentation
        (0x5f00 << 112, 16),          // 5f00::/16 segment routing
        (0xfc00 << 112, 7),           // fc00::/7 unique local
        (0xfe80 << 112, 10),          // fe80::/10 link-local
        (0xfec0 << 112, 10),          // fec0::/10 site-local (deprecated)
        (0xff00 << 112, 8),           // ff00::/8 multicast
    ];
    !BLOCKS
        .iter()
        .any(|&(prefix, len)| in_block(a, 128, prefix, len))
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
            "0.0.0.0",
            "0.1.2.3",
            "198.18.0.1",
            "198.19.255.255",
            "240.0.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "192.0.0.8",
            "::",
            "::1",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "2001:db8::1",
            "2001::1",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:10.0.0.1",
            "::ffff:127.0.0.1",
        ] {
            assert!(!public(&private.parse().expect("ip")), "{private}");
        }
        for open in [
            "1.1.1.1",
            "8.8.8.8",
            "198.20.0.1",
            "2606:4700::1111",
            "2400:3200::1",
        ] {
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
        // Named in allow only, the same host still may not be reached: its address is private.
        let err = fetcher(&["localhost"]).fetch("http://localhost:9/").await;
        assert!(err.contains("not a public address"), "{err}");
        // Named in allow_private as well, it resolves: the failure is then the closed port.
        let private = Fetcher::new(&FetchUrlConfig {
            enabled: true,
            allow: vec!["localhost".into()],
            allow_private: vec!["localhost".into()],
            ..Default::default()
        })
        .expect("on");
        let err = private.fetch("http://localhost:9/").await;
        assert!(!err.contains("not a public address"), "{err}");
        assert!(
            Fetcher::new(&FetchUrlConfig::default()).is_none(),
            "off by default"
        );
    }

    #[tokio::test]
    async fn through_a_proxy_the_targets_addresses_are_still_checked_first() {
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = proxy.local_addr().expect("addr");
        let fetcher = Fetcher::new(&FetchUrlConfig {
            enabled: true,
            allow: vec!["*".into()],
            proxy: format!("http://{addr}"),
            ..Default::default()
        })
        .expect("on");
        for target in [
            "http://localhost:5432/",
            "http://127.0.0.1/",
            "http://[::1]/",
        ] {
            let err = fetcher.fetch(target).await;
            assert!(err.contains("not a public address"), "{target}: {err}");
        }
        // The proxy was never asked: it would have resolved localhost itself.
        let asked =
            tokio::time::timeout(std::time::Duration::from_millis(50), proxy.accept()).await;
        assert!(asked.is_err(), "the proxy was asked");
        let bad = Fetcher::new(&FetchUrlConfig {
            enabled: true,
            proxy: "not a url".into(),
            ..Default::default()
        });
        assert!(bad.is_none(), "a bad proxy turns the tool off");
    }
}
