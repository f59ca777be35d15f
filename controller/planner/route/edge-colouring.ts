/**
 * Proper edge colouring of bipartite multigraphs with exactly Δ colours (König's theorem).
 *
 * Perfect routing gives every DP flow its own colour at its sending and at its receiving rack;
 * a colour is an uplink (and the spine behind it). The method here colours edges one at a
 * time and, when the two endpoints have no free colour in common, swaps the two colours along
 * an alternating (Kempe) path, which in a bipartite graph never returns to the other endpoint.
 * That costs O(E·(Δ + V)) in the worst case and far less on routing graphs, whose alternating
 * paths are short; `hopcroft-karp.ts` holds the paper's method for comparison.
 */

/** Edges `from[e]` (left vertex) → `to[e]` (right vertex); parallel edges allowed. */
export interface BipartiteMultigraph {
  readonly left: number;
  readonly right: number;
  readonly from: ArrayLike<number>;
  readonly to: ArrayLike<number>;
}

export interface EdgeColouring {
  /** `colours[e]` in `0 … count-1`. */
  readonly colours: Int32Array;
  /** Colours used: Δ of the graph. */
  readonly count: number;
}

/** Δ: the most edges at any vertex, on either side. */
export function maxDegree(graph: BipartiteMultigraph): number {
  const out = new Int32Array(graph.left);
  const inn = new Int32Array(graph.right);
  let delta = 0;
  for (let e = 0; e < graph.from.length; e++) {
    const u = graph.from[e] as number;
    const v = graph.to[e] as number;
    delta = Math.max(delta, ++out[u]!, ++inn[v]!);
  }
  return delta;
}

/** Colours every edge with Δ colours so that no two edges at a vertex share one. */
export function colourEdges(graph: BipartiteMultigraph): EdgeColouring {
  checkGraph(graph);
  const delta = maxDegree(graph);
  const edges = graph.from.length;
  const colours = new Int32Array(edges).fill(-1);
  // at[vertex·Δ + colour] = the edge of that colour at the vertex, or -1; right vertices
  // follow the left ones.
  const at = new Int32Array((graph.left + graph.right) * delta).fill(-1);
  const endOf = (edge: number, vertex: number): number => {
    const u = graph.from[edge] as number;
    return vertex === u ? graph.left + (graph.to[edge] as number) : u;
  };
  const freeAt = (vertex: number): number => {
    const base = vertex * delta;
    let c = 0;
    while (at[base + c] !== -1) c++;
    return c;
  };
  const path: number[] = [];

  for (let e = 0; e < edges; e++) {
    const u = graph.from[e] as number;
    const v = graph.left + (graph.to[e] as number);
    const a = freeAt(u);
    if (at[v * delta + a] !== -1) {
      // a is busy at v: flip the a/b path starting at v so that a becomes free there. The path
      // reaches left vertices only through a-edges, and u has none, so u keeps a free.
      const b = freeAt(v);
      path.length = 0;
      let x = v;
      let c = a;
      for (let f = at[x * delta + c]!; f !== -1; f = at[x * delta + c]!) {
        path.push(f);
        x = endOf(f, x);
        c = c === a ? b : a;
      }
      for (const f of path) {
        const col = colours[f]!;
        at[(graph.from[f] as number) * delta + col] = -1;
        at[(graph.left + (graph.to[f] as number)) * delta + col] = -1;
      }
      for (const f of path) {
        const col = colours[f] === a ? b : a;
        colours[f] = col;
        at[(graph.from[f] as number) * delta + col] = f;
        at[(graph.left + (graph.to[f] as number)) * delta + col] = f;
      }
    }
    colours[e] = a;
    at[u * delta + a] = e;
    at[v * delta + a] = e;
  }
  return { colours, count: delta };
}

/** True when no vertex has two edges of one colour and every colour is in `0 … count-1`. */
export function isProperColouring(graph: BipartiteMultigraph, colouring: EdgeColouring): boolean {
  const { colours, count } = colouring;
  if (colours.length !== graph.from.length) return false;
  const seenLeft = new Uint8Array(graph.left * count);
  const seenRight = new Uint8Array(graph.right * count);
  for (let e = 0; e < colours.length; e++) {
    const c = colours[e]!;
    if (!(c >= 0 && c < count)) return false;
    const l = (graph.from[e] as number) * count + c;
    const r = (graph.to[e] as number) * count + c;
    if (seenLeft[l] || seenRight[r]) return false;
    seenLeft[l] = 1;
    seenRight[r] = 1;
  }
  return true;
}

/** Rejects edges whose endpoints lie outside the graph; a programming error, not bad input. */
export function checkGraph(graph: BipartiteMultigraph): void {
  if (graph.from.length !== graph.to.length) {
    throw new RangeError(`graph.from has ${graph.from.length} edges but graph.to has ${graph.to.length}; they must match`);
  }
  for (let e = 0; e < graph.from.length; e++) {
    const u = graph.from[e] as number;
    const v = graph.to[e] as number;
    if (!(Number.isInteger(u) && u >= 0 && u < graph.left && Number.isInteger(v) && v >= 0 && v < graph.right)) {
      throw new RangeError(`edge ${e} (${u} → ${v}) leaves the graph (${graph.left} left, ${graph.right} right vertices)`);
    }
  }
}
