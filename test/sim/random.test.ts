import { describe, expect, it } from "vitest";
import { Random } from "../../controller/simulator/random.ts";

const draws = (random: Random, n: number) => Array.from({ length: n }, () => random.float());

describe("Random", () => {
  it("repeats its sequence for the same seed and differs for another", () => {
    expect(draws(new Random(7), 50)).toEqual(draws(new Random(7), 50));
    expect(draws(new Random(7), 50)).not.toEqual(draws(new Random(8), 50));
  });

  it("keeps every helper inside its range", () => {
    const random = new Random(1);
    for (let i = 0; i < 2000; i++) {
      const f = random.float();
      expect(f).toBeGreaterThanOrEqual(0);
      expect(f).toBeLessThan(1);
      const u = random.uniform(-3, 5);
      expect(u).toBeGreaterThanOrEqual(-3);
      expect(u).toBeLessThan(5);
      const k = random.int(2, 4);
      expect([2, 3, 4]).toContain(k);
      expect(random.exponential(3)).toBeGreaterThanOrEqual(0);
    }
  });

  it("draws integers, choices and weights with the right frequencies", () => {
    const random = new Random(42);
    const n = 40_000;
    const ints = new Map<number, number>();
    const weighted = new Map<string, number>();
    for (let i = 0; i < n; i++) {
      const k = random.int(1, 4);
      ints.set(k, (ints.get(k) ?? 0) + 1);
      const w = random.weighted([
        ["a", 1],
        ["never", 0],
        ["b", 3],
      ] as const);
      weighted.set(w, (weighted.get(w) ?? 0) + 1);
    }
    for (const k of [1, 2, 3, 4]) expect((ints.get(k) ?? 0) / n).toBeCloseTo(0.25, 1);
    expect(weighted.get("never")).toBeUndefined();
    expect((weighted.get("b") ?? 0) / n).toBeCloseTo(0.75, 1);
    expect(new Set(Array.from({ length: 200 }, () => random.choice(["x", "y", "z"])))).toEqual(new Set(["x", "y", "z"]));
  });

  it("has an exponential mean of one over the rate", () => {
    const random = new Random(3);
    const n = 40_000;
    let sum = 0;
    for (let i = 0; i < n; i++) sum += random.exponential(4);
    expect(sum / n).toBeCloseTo(0.25, 2);
  });

  it("rejects arguments it cannot honour", () => {
    const random = new Random(0);
    expect(() => new Random(1.5)).toThrow(RangeError);
    expect(() => random.int(3, 2)).toThrow(RangeError);
    expect(() => random.exponential(0)).toThrow(RangeError);
    expect(() => random.choice([])).toThrow(RangeError);
    expect(() => random.weighted([["a", 0]])).toThrow(RangeError);
    expect(() =>
      random.weighted([
        ["a", -1],
        ["b", 2],
      ]),
    ).toThrow(RangeError);
  });
});
