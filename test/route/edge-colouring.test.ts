import { describe, expect, it } from "vitest";
import { colourEdges, isProperColouring, maxDegree, type BipartiteMultigraph } from "../../controller/planner/route/edge-colouring.ts";
import { colourByRegularMatchings } from "../../controller/planner/route/hopcroft-karp.ts";
import { Random } from "../../controller/simulator/random.ts";

function randomGraph(seed: number): BipartiteMultigraph {
  const random = new Random(seed);
  const left = random.int(1, 40);
  const right = random.int(1, 40);
  const edges = random.int(0, 300);
  // Skewed endpoints so that some vertices are hot and parallel edges are common.
  const pick = (n: number) => Math.floor(n * random.float() ** 2);
  return {
    left,
    right,
    from: Array.from({ length: edges }, () => pick(left)),
    to: Array.from({ length: edges }, () => pick(right)),
  };
}

const methods = [
  ["alternating paths", colourEdges],
  ["padded regular Hopcroft–Karp", colourByRegularMatchings],
] as const;

describe.each(methods)("%s", (_, colour) => {
  it("properly colours random bipartite multigraphs with exactly Δ colours", () => {
    for (let seed = 1; seed <= 300; seed++) {
      const graph = randomGraph(seed);
      const colouring = colour(graph);
      const delta = maxDegree(graph);
      expect(colouring.count, `seed ${seed}`).toBe(delta);
      expect(isProperColouring(graph, colouring), `seed ${seed}`).toBe(true);
      // Exactly Δ: every colour is used (a Δ-degree vertex needs all of them).
      expect(new Set(colouring.colours).size, `seed ${seed}`).toBe(delta);
    }
  });

  it("colours Δ parallel edges between one pair with Δ colours", () => {
    const graph = { left: 1, right: 1, from: [0, 0, 0, 0, 0], to: [0, 0, 0, 0, 0] };
    expect([...colour(graph).colours].sort()).toEqual([0, 1, 2, 3, 4]);
  });

  it("returns an empty colouring for a graph without edges", () => {
    const colouring = colour({ left: 3, right: 2, from: [], to: [] });
    expect(colouring.count).toBe(0);
    expect(colouring.colours).toHaveLength(0);
  });

  it("rejects an edge that leaves the graph, naming it", () => {
    expect(() => colour({ left: 2, right: 2, from: [0, 2], to: [1, 0] })).toThrow(/edge 1 \(2 → 0\) leaves the graph/);
  });
});

describe("isProperColouring", () => {
  it("catches two edges of one colour at a vertex", () => {
    const graph = { left: 2, right: 2, from: [0, 1], to: [0, 0] };
    expect(isProperColouring(graph, { colours: Int32Array.from([0, 0]), count: 2 })).toBe(false);
    expect(isProperColouring(graph, { colours: Int32Array.from([0, 1]), count: 2 })).toBe(true);
    expect(isProperColouring(graph, { colours: Int32Array.from([0, 2]), count: 2 })).toBe(false);
  });
});
