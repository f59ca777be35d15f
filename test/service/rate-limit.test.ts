import { describe, expect, it } from "vitest";
import { RateLimiter } from "../../controller/service/rate-limit.ts";

describe("per-client rate limit", () => {
  it("allows a burst, refuses past it, and refills at the rate", () => {
    const limiter = new RateLimiter({ perSecond: 10, burst: 2, clients: 4 });
    expect([0, 0, 0, 0].map((t) => limiter.take("a", t))).toEqual(["allow", "allow", "refuse-first", "refuse"]);
    expect(limiter.take("a", 99)).toBe("refuse");
    expect(limiter.take("a", 100)).toBe("allow");
    expect(limiter.take("a", 100)).toBe("refuse-first");
    expect(limiter.take("a", 10_000)).toBe("allow");
    expect(limiter.take("a", 10_000)).toBe("allow");
    expect(limiter.take("a", 10_000)).toBe("refuse-first");
  });

  it("scales a bucket's burst and rate by the peers it stands for", () => {
    const limiter = new RateLimiter({ perSecond: 10, burst: 2, clients: 4 });
    expect([0, 0, 0, 0, 0, 0, 0].map((t) => limiter.take("job", t, 3))).toEqual(["allow", "allow", "allow", "allow", "allow", "allow", "refuse-first"]);
    // 30 a second: one more in 34 ms, not 100.
    expect(limiter.take("job", 34, 3)).toBe("allow");
    expect(limiter.take("job", 34, 3)).toBe("refuse-first");
  });

  it("keeps clients apart", () => {
    const limiter = new RateLimiter({ perSecond: 1, burst: 1, clients: 4 });
    expect(limiter.take("a", 0)).toBe("allow");
    expect(limiter.take("a", 0)).toBe("refuse-first");
    expect(limiter.take("b", 0)).toBe("allow");
  });

  it("holds at most its table size, forgetting the client heard from least recently", () => {
    const limiter = new RateLimiter({ perSecond: 1, burst: 1, clients: 2 });
    limiter.take("a", 0);
    limiter.take("b", 0);
    expect(limiter.take("a", 0)).toBe("refuse-first");
    for (let i = 0; i < 1_000; i++) limiter.take(`c${i}`, 0);
    expect(limiter.size).toBe(2);
    // "a" was forgotten and comes back with a full bucket; the last newcomer was not.
    expect(limiter.take("a", 0)).toBe("allow");
    expect(limiter.take("c999", 0)).toBe("refuse-first");
  });

  it("does not refill when the clock steps back", () => {
    const limiter = new RateLimiter({ perSecond: 1_000, burst: 1, clients: 2 });
    expect(limiter.take("a", 5_000)).toBe("allow");
    expect(limiter.take("a", 0)).toBe("refuse-first");
  });
});
