//! Whether a job's proxy lets a connection to `host:port` through, and to which
//! addresses: names are resolved here, once, and only the addresses checked are
//! connected to (no second lookup for a rebinding resolver to answer differently).

use std::net::{IpAddr, SocketAddr};

use crate::proto::egress::{host_name, special, Rules};

/// Why a connection was refused: said in the proxy's 403 and counted in the job's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refused {
    pub(super) why: String,
    /// An address was refused (a literal, or a special one a name led to), which the job's
    /// record keeps room for.
    pub(super) address: bool,
}

/// What the proxy does with a request for `host:port`.
#[derive(Debug)]
pub(super) enum Verdict {
    /// Connect to these, in order.
    Connect(Vec<SocketAddr>),
    Refused(Refused),
    /// The name did not resolve (not a refusal: a 502).
    Unresolved(String),
}

/// `host` as a request names it: an address (IPv6 in brackets or not) or a host name.
pub(super) fn address_of(host: &str) -> Option<IpAddr> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse().ok()
}

/// The rules' verdict on `host:port`, resolving a name through `resolve`.
pub(super) async fn decide<F, Fut>(rules: &Rules, host: &str, port: u16, resolve: F) -> Verdict
where
    F: FnOnce(String, u16) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<Vec<SocketAddr>>>,
{
    if let Some(ip) = address_of(host) {
        return match rules.for_address(ip, port) {
            Some(_) => Verdict::Connect(vec![SocketAddr::new(ip.to_canonical(), port)]),
            None => Verdict::Refused(Refused {
                why: format!("no rule allows the address {ip} on port {port}"),
                address: true,
            }),
        };
    }
    let Some(name) = host_name(host) else {
        return Verdict::Refused(Refused {
            why: "not a host name".into(),
            address: false,
        });
    };
    if rules.for_name(&name, port).is_none() {
        return Verdict::Refused(Refused {
            why: format!("no rule allows {name} on port {port}"),
            address: false,
        });
    }
    let addrs = match resolve(name.clone(), port).await {
        Ok(a) if !a.is_empty() => a,
        Ok(_) => return Verdict::Unresolved(format!("{name} has no address")),
        Err(e) => return Verdict::Unresolved(format!("{name} did not resolve: {e}")),
    };
    let (ok, refused): (Vec<SocketAddr>, Vec<SocketAddr>) = addrs
        .into_iter()
        .map(|a| SocketAddr::new(a.ip().to_canonical(), port))
        .partition(|a| special(a.ip()).is_none() || rules.for_address(a.ip(), port).is_some());
    if !ok.is_empty() {
        return Verdict::Connect(ok);
    }
    let first = refused[0].ip();
    Verdict::Refused(Refused {
        why: format!(
            "{name} resolves to {first} ({}), which no rule names",
            special(first).unwrap_or("special")
        ),
        address: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::egress::Network;

    fn rules(s: &str) -> Rules {
        match s.parse::<Network>().unwrap() {
            Network::Allow(r) => r,
            _ => unreachable!(),
        }
    }

    fn resolves_to(
        ips: &'static [&'static str],
    ) -> impl FnOnce(String, u16) -> std::future::Ready<std::io::Result<Vec<SocketAddr>>> {
        move |_, port| {
            std::future::ready(Ok(ips
                .iter()
                .map(|i| SocketAddr::new(i.parse().unwrap(), port))
                .collect()))
        }
    }

    async fn verdict(r: &str, host: &str, port: u16, ips: &'static [&'static str]) -> String {
        match decide(&rules(r), host, port, resolves_to(ips)).await {
            Verdict::Connect(a) => format!("connect {a:?}"),
            Verdict::Refused(r) => format!("refused: {}", r.why),
            Verdict::Unresolved(why) => format!("unresolved: {why}"),
        }
    }

    #[tokio::test]
    async fn a_name_leads_only_to_public_addresses_unless_one_is_named() {
        let r = "allow example.com:443 localhost:8443 127.0.0.1:8443";
        assert!(verdict(r, "example.com", 443, &["93.184.215.14"])
            .await
            .starts_with("connect"));
        let meta = verdict(r, "example.com", 443, &["169.254.169.254"]).await;
        assert_eq!(
            meta,
            "refused: example.com resolves to 169.254.169.254 (link-local), which no rule names"
        );
        let mixed = verdict(r, "example.com", 443, &["10.0.0.1", "93.184.215.14"]).await;
        assert_eq!(mixed, "connect [93.184.215.14:443]");
        assert!(verdict(r, "LocalHost.", 8443, &["127.0.0.1"])
            .await
            .starts_with("connect"));
        let v6 = verdict(r, "localhost", 8443, &["::1"]).await;
        assert!(
            v6.starts_with("refused: localhost resolves to ::1 (loopback)"),
            "{v6}"
        );
    }

    #[tokio::test]
    async fn addresses_and_ports_need_a_rule_of_their_own() {
        let r = "allow example.com:443 127.0.0.1:8443";
        assert_eq!(
            verdict(r, "example.com", 80, &[]).await,
            "refused: no rule allows example.com on port 80"
        );
        assert_eq!(
            verdict(r, "169.254.169.254", 80, &[]).await,
            "refused: no rule allows the address 169.254.169.254 on port 80"
        );
        assert_eq!(
            verdict(r, "93.184.215.14", 443, &[]).await,
            "refused: no rule allows the address 93.184.215.14 on port 443"
        );
        assert!(verdict(r, "[::ffff:127.0.0.1]", 8443, &[])
            .await
            .starts_with("connect"));
        assert_eq!(
            verdict(r, "exa mple.com", 443, &[]).await,
            "refused: not a host name"
        );
    }
}
