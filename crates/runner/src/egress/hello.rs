//! The server name a TLS ClientHello asks for (RFC 8446 4.1.2, RFC 6066 3): what the
//! proxy compares with the host a `CONNECT` was allowed for, so that a tunnel opened for
//! one name cannot carry a handshake for another (domain fronting).

/// What the first bytes of a tunnel say.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Hello {
    /// Not a TLS handshake record: nothing to compare.
    NotTls,
    /// More bytes are needed to read the record (at most [`MAX_RECORD`] in all).
    Incomplete,
    /// A ClientHello naming this server (lower case), or none.
    ServerName(Option<String>),
    /// A handshake record that is not a well-formed ClientHello.
    Malformed,
}

/// A TLS record's header and its largest body (2^14 plus expansion room).
pub(super) const MAX_RECORD: usize = 5 + 16384 + 2048;

/// Reads the ClientHello at the start of `bytes`, which must lie in its first record.
pub(super) fn read(bytes: &[u8]) -> Hello {
    match bytes {
        [] => return Hello::Incomplete,
        [0x16, ..] => {}
        // Another TLS record first (a warning alert, say) would slip the handshake past.
        [0x14..=0x18] => return Hello::Incomplete,
        [0x14..=0x18, 3, ..] => return Hello::Malformed,
        _ => return Hello::NotTls,
    }
    if bytes.len() < 5 {
        return Hello::Incomplete;
    }
    if bytes[1] != 3 {
        return Hello::NotTls;
    }
    let len = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
    if 5 + len > MAX_RECORD {
        return Hello::Malformed;
    }
    let Some(body) = bytes.get(5..5 + len) else {
        return Hello::Incomplete;
    };
    client_hello(body).map_or(Hello::Malformed, Hello::ServerName)
}

/// A cursor over a handshake message; every read is bounds-checked.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

fn client_hello(record: &[u8]) -> Option<Option<String>> {
    let mut c = Cursor(record);
    if c.u8()? != 1 {
        return None;
    }
    let len = c.take(3)?;
    let len = (usize::from(len[0]) << 16) | (usize::from(len[1]) << 8) | usize::from(len[2]);
    // A ClientHello spread over several records is refused: none of a real client's is.
    let mut c = Cursor(c.take(len)?);
    c.take(2 + 32)?; // legacy_version, random
    c.vec8()?; // legacy_session_id
    c.vec16()?; // cipher_suites
    c.vec8()?; // legacy_compression_methods
    if c.0.is_empty() {
        return Some(None);
    }
    let mut exts = Cursor(c.vec16()?);
    let mut name = None;
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind != 0 {
            continue;
        }
        if name.is_some() {
            return None;
        }
        let mut list = Cursor(Cursor(data).vec16()?);
        // One host_name entry (RFC 6066 forbids two of the same type).
        while !list.0.is_empty() {
            let kind = list.u8()?;
            let host = list.vec16()?;
            if kind == 0 {
                if name.is_some() {
                    return None;
                }
                name = Some(std::str::from_utf8(host).ok()?.to_ascii_lowercase());
            }
        }
    }
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as a client writes it, with `sni` and padding extensions around.
    fn hello(sni: Option<&str>) -> Vec<u8> {
        let mut exts = Vec::new();
        exts.extend([0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x1d]); // groups
        if let Some(name) = sni {
            let n = name.len() as u16;
            exts.extend([0x00, 0x00]);
            exts.extend((n + 5).to_be_bytes());
            exts.extend((n + 3).to_be_bytes());
            exts.push(0);
            exts.extend(n.to_be_bytes());
            exts.extend(name.as_bytes());
        }
        let mut body = vec![0x03, 0x03];
        body.extend([7u8; 32]);
        body.push(0);
        body.extend([0x00, 0x02, 0x13, 0x01]);
        body.extend([0x01, 0x00]);
        body.extend((exts.len() as u16).to_be_bytes());
        body.extend(exts);
        let mut msg = vec![1];
        msg.extend(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend(body);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend((msg.len() as u16).to_be_bytes());
        rec.extend(msg);
        rec
    }

    #[test]
    fn the_server_name_is_read_and_lower_cased() {
        assert_eq!(
            read(&hello(Some("GitHub.com"))),
            Hello::ServerName(Some("github.com".into()))
        );
        assert_eq!(read(&hello(None)), Hello::ServerName(None));
    }

    #[test]
    fn a_partial_record_asks_for_more_and_other_bytes_are_not_tls() {
        let h = hello(Some("a.example"));
        for cut in [0, 1, 4, 5, h.len() - 1] {
            assert_eq!(read(&h[..cut]), Hello::Incomplete, "cut at {cut}");
        }
        assert_eq!(read(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(read(b"SSH-2.0-OpenSSH"), Hello::NotTls);
        // A warning alert before the handshake is not let through unread.
        assert_eq!(read(&[0x15, 3, 1, 0, 2, 1, 0x5a]), Hello::Malformed);
    }

    #[test]
    fn every_truncation_inside_the_message_is_malformed_not_a_panic() {
        let h = hello(Some("a.example"));
        for cut in 6..h.len() {
            let mut rec = h[..cut].to_vec();
            let len = (cut - 5) as u16;
            rec[3..5].copy_from_slice(&len.to_be_bytes());
            assert_eq!(read(&rec), Hello::Malformed, "cut at {cut}");
        }
    }
}
