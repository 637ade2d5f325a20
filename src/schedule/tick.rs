//! A tick's member: the schedule and the tick time it stands for, so that it is the same
//! whoever enqueues it, and recognisable when it is claimed.

/// How every tick's member starts: a NUL, which no text payload starts with.
pub const TICK_PREFIX: &[u8] = b"\0delay-bridge:tick\0";

/// The member of `schedule`'s tick at `tick_ms`: in inline payload mode, with the body at its
/// end (`body`); in hash payload mode the member is an id and the body is stored under it.
pub fn member(schedule: &str, tick_ms: i64, body: Option<&[u8]>) -> Vec<u8> {
    let mut m = Vec::with_capacity(TICK_PREFIX.len() + schedule.len() + 24);
    m.extend_from_slice(TICK_PREFIX);
    m.extend_from_slice(schedule.as_bytes());
    m.push(0);
    m.extend_from_slice(tick_ms.to_string().as_bytes());
    if let Some(body) = body {
        m.push(0);
        m.extend_from_slice(body);
    }
    m
}

/// A claimed tick: its schedule, its time and, in inline mode, its body.
#[derive(Debug, PartialEq, Eq)]
pub struct Tick<'a> {
    /// The schedule's name.
    pub schedule: &'a str,
    /// The tick, epoch ms.
    pub tick_ms: i64,
    /// The body carried in the member (inline payload mode).
    pub body: Option<&'a [u8]>,
}

/// The tick `member` stands for, or `None` for any other member.
pub fn parse(member: &[u8]) -> Option<Tick<'_>> {
    let rest = member.strip_prefix(TICK_PREFIX)?;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let schedule = std::str::from_utf8(&rest[..end]).ok()?;
    let rest = rest.get(end + 1..)?;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let tick_ms = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    let body = rest.get(end + 1..).filter(|_| end < rest.len());
    Some(Tick {
        schedule,
        tick_ms,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_round_trip() {
        let m = member("nightly", 1_790_000_000_000, Some(b"{\"a\":0}"));
        let t = parse(&m).unwrap();
        assert_eq!(t.schedule, "nightly");
        assert_eq!(t.tick_ms, 1_790_000_000_000);
        assert_eq!(t.body, Some(&b"{\"a\":0}"[..]));
        let id = member("n", 5, None);
        assert_eq!(
            parse(&id),
            Some(Tick {
                schedule: "n",
                tick_ms: 5,
                body: None
            })
        );
        // An empty body is still a body.
        assert_eq!(
            parse(&member("n", 5, Some(b""))).unwrap().body,
            Some(&b""[..])
        );
        assert_eq!(parse(b"plain payload"), None);
        assert_eq!(parse(b"\0delay-bridge:tick\0n\0x"), None);
    }
}
