/**
 * A small seeded generator (mulberry32) so that a trace is a pure function of its seed: the
 * same seed gives the same jobs, the same arrivals and so the same snapshots on every machine.
 * `Math.random` cannot be seeded, which would make planner regressions impossible to replay.
 */
export class Random {
  #state: number;

  constructor(seed: number) {
    if (!Number.isInteger(seed)) throw new RangeError(`seed must be an integer, received ${seed}`);
    this.#state = seed >>> 0;
  }

  /** Uniform in [0, 1). */
  float(): number {
    this.#state = (this.#state + 0x6d2b79f5) >>> 0;
    let t = this.#state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** Uniform in [low, high). */
  uniform(low: number, high: number): number {
    return low + (high - low) * this.float();
  }

  /** Exponentially distributed with the given rate (mean `1 / rate`). */
  exponential(rate: number): number {
    if (!(rate > 0)) throw new RangeError(`rate must be positive, received ${rate}`);
    // 1 - u lies in (0, 1], so the logarithm is finite.
    return -Math.log(1 - this.float()) / rate;
  }

  /** Uniform integer in [low, high], both ends included. */
  int(low: number, high: number): number {
    if (!Number.isInteger(low) || !Number.isInteger(high) || high < low) {
      throw new RangeError(`int needs integers low <= high, received ${low} and ${high}`);
    }
    return low + Math.floor(this.float() * (high - low + 1));
  }

  /** One item, each equally likely. */
  choice<T>(items: readonly T[]): T {
    const item = items[Math.floor(this.float() * items.length)];
    if (item === undefined) throw new RangeError("choice needs at least one item");
    return item;
  }

  /** One value, drawn with probability proportional to its weight. */
  weighted<T>(entries: readonly (readonly [value: T, weight: number])[]): T {
    let total = 0;
    let last: T | undefined;
    for (const [value, weight] of entries) {
      if (!(weight >= 0)) throw new RangeError(`weights must not be negative, received ${weight}`);
      total += weight;
      if (weight > 0) last = value;
    }
    if (last === undefined) throw new RangeError("weighted needs a positive total weight");
    let remaining = this.float() * total;
    for (const [value, weight] of entries) {
      remaining -= weight;
      if (remaining < 0) return value;
    }
    // Rounding can leave a sliver past the last entry; it belongs to the last positive weight.
    return last;
  }
}
