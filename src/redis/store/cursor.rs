//! Where a page of a list ended: a cursor by score and member, or by place among the
//! members of one score, written so that it travels in a URL.

use std::fmt;

use base64::Engine;

/// Members longer than this end a page with a cursor by place, not by member: a cursor
/// travels in a URL.
pub(crate) const CURSOR_MEMBER_MAX: usize = 1024;

/// Where a page ended: the due score of its last entry and that entry's member, written as
/// `SCORE:MEMBER` with the member in unpadded URL-safe base64; or, after a member too large
/// for a URL, its place among the members of that score, written as `SCORE#PLACE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub(super) score: String,
    pub(super) member: Vec<u8>,
    /// The place among the members of `score` (`member` is then empty).
    pub(super) place: Option<u64>,
}

impl Cursor {
    /// After `member`, whose score Redis writes as `score`.
    pub(crate) fn after(score: String, member: Vec<u8>) -> Self {
        Self {
            score,
            member,
            place: None,
        }
    }

    /// After the member at `place` among the members of `score`.
    pub(crate) fn at_place(score: String, place: u64) -> Self {
        Self {
            score,
            member: Vec::new(),
            place: Some(place),
        }
    }

    /// The score, as Redis takes it.
    pub(crate) fn score(&self) -> &str {
        &self.score
    }

    /// The member (empty for a cursor by place).
    pub(crate) fn member(&self) -> &[u8] {
        &self.member
    }

    /// The place among the members of the score, for a cursor by place.
    pub(crate) fn place(&self) -> Option<u64> {
        self.place
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(place) = self.place {
            return write!(f, "{}#{place}", self.score);
        }
        let member = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&self.member);
        write!(f, "{}:{member}", self.score)
    }
}

impl std::str::FromStr for Cursor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a cursor from a previous page");
        let by_place = s.split_once('#');
        let (score, rest) = by_place.or_else(|| s.split_once(':')).ok_or_else(bad)?;
        // Redis takes any float as a bound but NaN (and Rust would parse `NaN`, `nan`, `inf`).
        let parsed = score.parse::<f64>().map_err(|_| bad())?;
        if parsed.is_nan() {
            return Err(bad());
        }
        if by_place.is_some() {
            return Ok(Self {
                score: score.to_string(),
                member: Vec::new(),
                place: Some(rest.parse().map_err(|_| bad())?),
            });
        }
        let member = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(rest)
            .map_err(|_| bad())?;
        Ok(Self {
            score: score.to_string(),
            member,
            place: None,
        })
    }
}
