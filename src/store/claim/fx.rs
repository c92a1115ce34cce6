//! The chooser's hasher: a claim looks every candidate it read up in a few maps, several
//! times, and with the default SipHash those look-ups were about 2% of the relay's
//! instructions per delivered row (callgrind, PostgreSQL drain against Node).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// The chooser's maps, hashed by [`Fx`].
pub type Fast<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;
/// The chooser's sets of row ids, hashed by [`Fx`].
pub type Ids = HashSet<i64, BuildHasherDefault<Fx>>;

/// A multiply-rotate hasher (the Fx hash of rustc). Not resistant to chosen collisions, which
/// is fine here: the keys are the row ids the database assigned and the channel names of the
/// configured sinks' budgets, in maps that live for one claim.
#[derive(Default)]
pub struct Fx(u64);

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_i64(&mut self, n: i64) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
