//! A job's network policy (docs/security.md, "Egress"): `none`, `allow RULE…` or `open`,
//! from the narrowest, and the rules `allow` is made of. One text form everywhere (the
//! job spec, the desired state, `runner.network`, the command line), so that what an
//! operator writes is what every layer compares.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde_with::{DeserializeFromStr, SerializeDisplay};

/// Rules in one policy, at most: a policy is a list to read, not a firewall to compile.
pub const MAX_RULES: usize = 64;

/// What a job may reach.
#[derive(Debug, Clone, PartialEq, Eq, Hash, SerializeDisplay, DeserializeFromStr)]
pub enum Network {
    /// A network namespace of its own with loopback only: nothing outside the job.
    None,
    /// A network namespace of its own whose only way out is the runner's proxy, which
    /// lets through what one of these rules names.
    Allow(Rules),
    /// The host's network, as an unsandboxed process has it.
    Open,
}

impl Network {
    /// The policy's kind, without its rules.
    pub fn kind(&self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Allow(_) => "allow",
            Network::Open => "open",
        }
    }

    /// Whether the job has a network namespace of its own (`none` and `allow`).
    pub fn own_namespace(&self) -> bool {
        !matches!(self, Network::Open)
    }

    /// Whether a job asking for `self` asks for no more than `policy` gives: `none`
    /// within anything, `open` within `open` only, and `allow` within `open`, or within
    /// an `allow` where each of its rules lies inside one of the policy's.
    pub fn within(&self, policy: &Network) -> bool {
        match (self, policy) {
            (Network::None, _) | (_, Network::Open) => true,
            (Network::Allow(asked), Network::Allow(given)) => {
                asked.0.iter().all(|a| given.0.iter().any(|g| a.within(g)))
            }
            _ => false,
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Network::Allow(rules) => write!(f, "allow {rules}"),
            other => f.write_str(other.kind()),
        }
    }
}

impl FromStr for Network {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut words = s.split_ascii_whitespace();
        let kind = words.next().unwrap_or("");
        let rest: Vec<&str> = words.collect();
        match kind {
            "none" | "open" if !rest.is_empty() => Err(format!(
                "network {kind:?} takes no rules (only \"allow\" does): {s:?}"
            )),
            "none" => Ok(Network::None),
            "open" => Ok(Network::Open),
            "allow" => Ok(Network::Allow(Rules::parse(&rest)?)),
            _ => Err(format!(
                "{s:?} is not a network policy: none, open, or \"allow RULE…\" (RULE: host:443, *.suffix:443, 10.0.0.0/8:80,443, [::1]:8080)"
            )),
        }
    }
}

/// The rules of an `allow` policy: never empty (an empty list is `none`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rules(Vec<Rule>);

impl Rules {
    /// Rules from their text forms, as `--allow` gives them one by one.
    pub fn parse<S: AsRef<str>>(texts: &[S]) -> Result<Self, String> {
        let rules = texts
            .iter()
            .map(|t| t.as_ref().parse())
            .collect::<Result<Vec<Rule>, _>>()?;
        Rules::new(rules)
    }

    /// Rules already parsed one by one (`--allow`).
    pub fn new(rules: Vec<Rule>) -> Result<Self, String> {
        match rules.len() {
            0 => Err("network \"allow\" needs at least one rule (HOST:PORTS); with none, ask for network \"none\"".into()),
            n if n > MAX_RULES => Err(format!("{n} network rules; at most {MAX_RULES}")),
            _ => Ok(Rules(rules)),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Rule> {
        self.0.iter()
    }

    /// The first rule letting a connection to the name `host` (lower case, no trailing
    /// dot) on `port` through, by its name alone.
    pub fn for_name(&self, host: &str, port: u16) -> Option<&Rule> {
        self.0
            .iter()
            .find(|r| r.ports.contains(port) && r.host.matches_name(host))
    }

    /// The first rule naming the address `ip` (or a range holding it) with `port`: what
    /// an address literal needs, and what a special address (loopback, link-local,
    /// private) needs whatever name led to it.
    /// A special address needs a range of /8 or narrower: `0.0.0.0/0` or `[::/0]` means
    /// "the Internet", never the metadata address or the host's loopback.
    pub fn for_address(&self, ip: IpAddr, port: u16) -> Option<&Rule> {
        let ip = ip.to_canonical();
        let narrow = |h: &Host| match h {
            Host::Net(_, len) => special(ip).is_none() || *len >= 8,
            _ => false,
        };
        self.0
            .iter()
            .find(|r| r.ports.contains(port) && r.host.holds(ip) && narrow(&r.host))
    }
}

impl fmt::Display for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// One destination of an `allow` policy: a host and its ports.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub host: Host,
    pub ports: Ports,
}

impl Rule {
    /// Whether every connection `self` lets through, `other` lets through too.
    pub fn within(&self, other: &Rule) -> bool {
        self.ports.within(&other.ports) && self.host.within(&other.host)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.ports)
    }
}

impl FromStr for Rule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("network rule {s:?}: {why} (HOST:PORTS, e.g. github.com:443, *.crates.io:443, 10.0.0.0/8:80,443, [::1]:8080)")
        };
        let (host, ports) = if let Some(rest) = s.strip_prefix('[') {
            let (inner, after) = rest.split_once(']').ok_or_else(|| bad("no closing ]"))?;
            let ports = after.strip_prefix(':').ok_or_else(|| bad("no ports"))?;
            let host = Host::address(inner).ok_or_else(|| bad("not an IPv6 address or range"))?;
            if !matches!(host, Host::Net(IpAddr::V6(_), _)) {
                return Err(bad("only an IPv6 address goes in brackets"));
            }
            (host, ports)
        } else {
            let (host, ports) = s.rsplit_once(':').ok_or_else(|| bad("no ports"))?;
            if host.contains(':') {
                return Err(bad("an IPv6 address goes in brackets"));
            }
            (Host::parse(host).map_err(|why| bad(&why))?, ports)
        };
        let ports = ports.parse().map_err(|why: String| bad(&why))?;
        Ok(Rule { host, ports })
    }
}

/// The host part of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// This name exactly (lower case, no trailing dot).
    Name(String),
    /// Every name ending in `.suffix` (`*.crates.io`: `static.crates.io`, not `crates.io`).
    Suffix(String),
    /// An address (`/32`, `/128`) or a range of them.
    Net(IpAddr, u8),
}

impl Host {
    fn parse(s: &str) -> Result<Self, String> {
        if let Some(h) = Host::address(s) {
            return Ok(h);
        }
        if let Some(suffix) = s.strip_prefix("*.") {
            return Ok(Host::Suffix(host_name(suffix).ok_or("not a host name")?));
        }
        Ok(Host::Name(host_name(s).ok_or("not a host name")?))
    }

    /// An address or a range (`ADDR/LEN`), with no host bits set.
    fn address(s: &str) -> Option<Self> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a.parse::<IpAddr>().ok()?, Some(decimal(l)? as u8)),
            None => (s.parse::<IpAddr>().ok()?, None),
        };
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = len.unwrap_or(max);
        (len <= max && mask(addr, len) == addr).then_some(Host::Net(addr, len))
    }

    fn matches_name(&self, name: &str) -> bool {
        match self {
            Host::Name(n) => n == name,
            Host::Suffix(s) => name
                .strip_suffix(s.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            Host::Net(..) => false,
        }
    }

    fn holds(&self, ip: IpAddr) -> bool {
        match *self {
            Host::Net(net, len) => net.is_ipv4() == ip.is_ipv4() && mask(ip, len) == net,
            _ => false,
        }
    }

    fn within(&self, other: &Host) -> bool {
        match (self, other) {
            (Host::Name(n), o) => o.matches_name(n),
            (Host::Suffix(s), Host::Suffix(t)) => s == t || Host::Suffix(t.clone()).matches_name(s),
            (Host::Net(a, l), Host::Net(_, m)) => l >= m && other.holds(*a),
            _ => false,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Suffix(s) => write!(f, "*.{s}"),
            Host::Net(IpAddr::V4(a), 32) => write!(f, "{a}"),
            Host::Net(IpAddr::V6(a), 128) => write!(f, "[{a}]"),
            Host::Net(IpAddr::V4(a), l) => write!(f, "{a}/{l}"),
            Host::Net(IpAddr::V6(a), l) => write!(f, "[{a}/{l}]"),
        }
    }
}

/// `name` in the form rules and the proxy compare: lower case, no trailing dot, letters,
/// digits, `-` and `_` in dot-separated labels of 1 to 63 bytes, 253 at most in all.
pub fn host_name(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        // `2130706433`, `0x7f.1`: an address in another spelling, not a name.
        && !name
            .rsplit('.')
            .next()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()) || l.starts_with("0x"));
    ok.then_some(name)
}

/// A number as written plainly: digits only, no sign, no leading zero.
fn decimal(s: &str) -> Option<u32> {
    let plain = !s.is_empty()
        && s.len() <= 5
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'));
    plain.then(|| s.parse().ok()).flatten()
}

fn mask(ip: IpAddr, len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// The ports of a rule: single ports and ranges.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ports(Vec<(u16, u16)>);

impl Ports {
    pub fn contains(&self, port: u16) -> bool {
        self.0.iter().any(|&(lo, hi)| lo <= port && port <= hi)
    }

    fn within(&self, other: &Ports) -> bool {
        // Each range of `self` inside one of `other`'s: exact for ranges written apart.
        self.0
            .iter()
            .all(|&(lo, hi)| other.0.iter().any(|&(a, b)| a <= lo && hi <= b))
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(lo, hi)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for Ports {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let port = |p: &str| match decimal(p).and_then(|n| u16::try_from(n).ok()) {
            Some(n) if n > 0 => Ok(n),
            _ => Err(format!("{p:?} is not a port (1-65535)")),
        };
        let ranges = s
            .split(',')
            .map(|part| match part.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (port(lo)?, port(hi)?);
                    if lo > hi {
                        return Err(format!("port range {part:?} ends before it starts"));
                    }
                    Ok((lo, hi))
                }
                None => port(part).map(|p| (p, p)),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Ports(ranges))
    }
}

/// Why an address is special: one a name must never lead to unless a rule names the
/// address itself (loopback, link-local with the cloud metadata address, private, and
/// every range not meant for the public Internet). `None`: a public address.
pub fn special(ip: IpAddr) -> Option<&'static str> {
    match ip.to_canonical() {
        IpAddr::V4(a) => {
            let o = a.octets();
            Some(match o {
                _ if a.is_loopback() => "loopback",
                _ if a.is_link_local() => "link-local",
                _ if a.is_private() => "private",
                _ if a.is_unspecified() || o[0] == 0 => "unspecified",
                [100, b, ..] if (64..128).contains(&b) => "shared address space",
                [192, 0, 0, _] | [198, 18..=19, ..] | [192, 88, 99, _] => "reserved",
                // Azure's platform address (its metadata and DNS beside the VM's).
                [168, 63, 129, 16] => "cloud platform",
                _ if a.is_multicast() || a.is_broadcast() || o[0] >= 240 => "not unicast",
                _ if a.is_documentation() => "documentation",
                _ => return None,
            })
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            Some(match s[0] {
                _ if a.is_loopback() => "loopback",
                _ if a.is_unspecified() => "unspecified",
                x if x & 0xffc0 == 0xfe80 => "link-local",
                x if x & 0xfe00 == 0xfc00 => "private",
                x if x & 0xff00 == 0xff00 => "not unicast",
                x if x & 0xffc0 == 0xfec0 => "site-local",
                0x64 if s[1] == 0xff9b => "translated",
                0x2002 => "translated",
                0x2001 if s[1] == 0 => "translated",
                0x2001 if s[1] == 0xdb8 => "documentation",
                0 | 0x100 => "reserved",
                _ => return None,
            })
        }
    }
}

/// Connections a job's proxy refused to one destination for one reason.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Denial {
    /// `host:port` as the job asked for it.
    pub destination: String,
    /// The rule it missed, or what else refused it.
    pub reason: String,
    pub count: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Network {
        s.parse().expect(s)
    }

    #[test]
    fn policies_read_and_write_the_same_text() {
        for s in [
            "none",
            "open",
            "allow github.com:443",
            "allow *.crates.io:443 10.0.0.0/8:80,8000-8080 [::1]:22 [fd00::/8]:443",
        ] {
            assert_eq!(net(s).to_string(), s);
        }
        assert_eq!(
            net("allow GitHub.com.:443").to_string(),
            "allow github.com:443"
        );
    }

    #[test]
    fn bad_policies_are_refused_with_the_grammar() {
        for s in [
            "",
            "closed",
            "allow",
            "none github.com:443",
            "allow github.com",
            "allow github.com:0",
            "allow github.com:443-80",
            "allow ::1:443",
            "allow [github.com]:443",
            "allow 10.0.0.1/8:443",
            "allow 10.0.0.0/33:443",
            "allow exa mple.com:443",
            "allow a..b:443",
            "allow 2130706433:443",
            "allow 0x7f.1:443",
            "allow -.-:443",
            "allow a.example:+443",
            "allow a.example:0443",
            "allow 10.0.0.0/+8:443",
        ] {
            assert!(s.parse::<Network>().is_err(), "{s:?} parsed");
        }
    }

    #[test]
    fn a_narrower_policy_is_within_and_a_wider_one_is_not() {
        let fleet = net("allow *.crates.io:443 github.com:22,443 10.0.0.0/8:1-65535");
        for asked in [
            "none",
            "allow static.crates.io:443",
            "allow *.x.crates.io:443 github.com:22",
            "allow 10.1.2.0/24:80 10.0.0.1:8080",
        ] {
            assert!(net(asked).within(&fleet), "{asked} not within");
        }
        for asked in [
            "open",
            "allow crates.io:443",
            "allow *.io:443",
            "allow github.com:80",
            "allow github.com:22-443",
            "allow 11.0.0.0/8:80",
            "allow 0.0.0.0/0:80",
        ] {
            assert!(!net(asked).within(&fleet), "{asked} within");
        }
        assert!(net("allow x.y:1").within(&Network::Open));
        assert!(!net("allow x.y:1").within(&Network::None));
        assert!(Network::None.within(&Network::None));
    }

    #[test]
    fn names_match_exactly_or_beneath_a_suffix() {
        let Network::Allow(rules) = net("allow *.crates.io:443 github.com:443") else {
            unreachable!()
        };
        assert!(rules.for_name("static.crates.io", 443).is_some());
        assert!(rules.for_name("crates.io", 443).is_none());
        assert!(rules.for_name("evilcrates.io", 443).is_none());
        assert!(rules.for_name("github.com", 443).is_some());
        assert!(rules.for_name("github.com", 80).is_none());
        assert!(rules.for_name("api.github.com", 443).is_none());
    }

    #[test]
    fn addresses_match_their_ranges_whatever_their_form() {
        let Network::Allow(rules) = net("allow 127.0.0.1:8443 [fd00::/8]:80") else {
            unreachable!()
        };
        let v4mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert!(rules.for_address(v4mapped, 8443).is_some());
        assert!(rules
            .for_address("127.0.0.2".parse().unwrap(), 8443)
            .is_none());
        assert!(rules.for_address("fd12::1".parse().unwrap(), 80).is_some());
        assert!(rules.for_address("fe80::1".parse().unwrap(), 80).is_none());
        // The whole Internet is not the host's loopback nor the metadata address.
        let Network::Allow(all) = net("allow 0.0.0.0/0:80 [::/0]:80") else {
            unreachable!()
        };
        assert!(all
            .for_address("93.184.215.14".parse().unwrap(), 80)
            .is_some());
        for ip in ["169.254.169.254", "127.0.0.1", "::1", "fd00:ec2::254"] {
            assert!(all.for_address(ip.parse().unwrap(), 80).is_none(), "{ip}");
        }
    }

    #[test]
    fn special_addresses_are_named_and_public_ones_are_not() {
        for (ip, why) in [
            ("169.254.169.254", "link-local"),
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("192.168.0.1", "private"),
            ("100.100.100.200", "shared address space"),
            ("::1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("fd00:ec2::254", "private"),
            ("fe80::1", "link-local"),
            ("0.0.0.0", "unspecified"),
        ] {
            assert_eq!(special(ip.parse().unwrap()), Some(why), "{ip}");
        }
        for ip in ["140.82.112.3", "2606:4700::1111"] {
            assert_eq!(special(ip.parse().unwrap()), None, "{ip}");
        }
    }
}
