//! A read()'s words, per the event's read format, as the model's numbers
//! for each member it shows.

use crate::model::{Handle, Observed};

use super::journal::ReadFormat;

/// One member's numbers in a read, with its `PERF_FORMAT_ID` id if asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub handle: Handle,
    pub observed: Observed,
    pub id: Option<u64>,
}

/// Splits `words` as perf lays them out: without `PERF_FORMAT_GROUP`
/// `value, [enabled], [running], [id]`; with it `nr, [enabled], [running]`
/// then `value, [id]` per member, leader first (`members` in group order),
/// the times being the leader's.
pub fn parse(
    words: &[u64],
    format: ReadFormat,
    handle: Handle,
    members: &[Handle],
) -> Result<Vec<Member>, String> {
    let times = usize::from(format.times) * 2;
    let id = usize::from(format.id);
    let lost = usize::from(format.lost);
    let mut it = words.iter().copied();
    let mut next = |what: &str| {
        it.next()
            .ok_or_else(|| format!("the read ended before the {what} ({words:?})"))
    };
    if !format.group {
        let value = next("value")?;
        let (enabled, running) = if format.times {
            (Some(next("time_enabled")?), Some(next("time_running")?))
        } else {
            (None, None)
        };
        let member_id = if format.id { Some(next("id")?) } else { None };
        if format.lost {
            no_lost(next("lost")?)?;
        }
        expect_len(words, 1 + times + id + lost)?;
        return Ok(vec![Member {
            handle,
            observed: Observed {
                value,
                enabled,
                running,
            },
            id: member_id,
        }]);
    }
    let nr = next("nr")?;
    if nr != members.len() as u64 {
        return Err(format!(
            "the group read shows {nr} members, the group has {} ({words:?})",
            members.len()
        ));
    }
    let (enabled, running) = if format.times {
        (Some(next("time_enabled")?), Some(next("time_running")?))
    } else {
        (None, None)
    };
    let mut out = Vec::new();
    for (i, &member) in members.iter().enumerate() {
        let value = next("value")?;
        let id = if format.id { Some(next("id")?) } else { None };
        if format.lost {
            no_lost(next("lost")?)?;
        }
        let observed = if i == 0 {
            Observed {
                value,
                enabled,
                running,
            }
        } else {
            Observed {
                value,
                enabled: None,
                running: None,
            }
        };
        out.push(Member {
            handle: member,
            observed,
            id,
        });
    }
    expect_len(words, 1 + times + members.len() * (1 + id + lost))?;
    Ok(out)
}

/// A counting event loses no samples: its `PERF_FORMAT_LOST` word is 0.
fn no_lost(lost: u64) -> Result<(), String> {
    if lost != 0 {
        return Err(format!(
            "PERF_FORMAT_LOST shows {lost} lost samples for a counting event"
        ));
    }
    Ok(())
}

fn expect_len(words: &[u64], want: usize) -> Result<(), String> {
    if words.len() != want {
        return Err(format!(
            "the read has {} words where its format gives {want} ({words:?})",
            words.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: ReadFormat = ReadFormat {
        times: false,
        id: false,
        group: false,
        lost: false,
    };

    #[test]
    fn single_and_group_reads_split_per_member() {
        let timed = ReadFormat {
            times: true,
            ..PLAIN
        };
        let m = parse(&[7, 100, 90], timed, 3, &[3]).unwrap();
        assert_eq!(
            m[0].observed,
            Observed {
                value: 7,
                enabled: Some(100),
                running: Some(90)
            }
        );
        let m = parse(&[7, 55], ReadFormat { id: true, ..PLAIN }, 3, &[3]).unwrap();
        assert_eq!((m[0].observed.enabled, m[0].id), (None, Some(55)));
        let group = ReadFormat {
            times: true,
            id: true,
            group: true,
            lost: false,
        };
        let m = parse(&[2, 100, 90, 7, 70, 8, 80], group, 5, &[4, 5]).unwrap();
        assert_eq!(
            m.iter()
                .map(|m| (m.handle, m.observed.value, m.id))
                .collect::<Vec<_>>(),
            vec![(4, 7, Some(70)), (5, 8, Some(80))]
        );
        assert_eq!(
            (m[0].observed.running, m[1].observed.running),
            (Some(90), None)
        );
    }

    #[test]
    fn a_lost_word_follows_each_value_and_must_be_zero() {
        let lost = ReadFormat {
            group: true,
            id: true,
            lost: true,
            ..PLAIN
        };
        let m = parse(&[2, 7, 70, 0, 8, 80, 0], lost, 5, &[4, 5]).unwrap();
        assert_eq!((m[1].observed.value, m[1].id), (8, Some(80)));
        let e = parse(&[2, 7, 70, 0, 8, 80, 3], lost, 5, &[4, 5]).unwrap_err();
        assert!(e.contains("3 lost samples"), "{e}");
        assert!(parse(&[2, 7, 70, 8, 80], lost, 5, &[4, 5]).is_err());
        let single = ReadFormat {
            times: true,
            lost: true,
            ..PLAIN
        };
        assert_eq!(
            parse(&[7, 100, 90, 0], single, 3, &[3]).unwrap()[0]
                .observed
                .value,
            7
        );
    }

    #[test]
    fn a_read_of_the_wrong_shape_is_an_error() {
        assert!(parse(&[7, 1], PLAIN, 1, &[1]).is_err());
        assert!(parse(&[], PLAIN, 1, &[1]).is_err());
        let group = ReadFormat {
            group: true,
            ..PLAIN
        };
        assert!(
            parse(&[3, 1, 2], group, 1, &[1, 2]).is_err(),
            "three members claimed"
        );
        assert!(
            parse(&[2, 1], group, 1, &[1, 2]).is_err(),
            "a value missing"
        );
    }
}
