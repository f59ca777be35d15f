import type { Highs, ModelData } from "highs";

/**
 * A mixed-integer program under construction: columns and sparse rows by index, handed to
 * HiGHS as one CSR model (no LP text to format and parse on the hot path).
 */
export class MipBuilder {
  private readonly cost: number[] = [];
  private readonly lower: number[] = [];
  private readonly upper: number[] = [];
  private readonly integer: (0 | 1)[] = [];
  private readonly rowLower: number[] = [];
  private readonly rowUpper: number[] = [];
  private readonly starts: number[] = [0];
  private readonly indices: number[] = [];
  private readonly values: number[] = [];

  get columns(): number {
    return this.cost.length;
  }

  variable(cost: number, lower: number, upper: number, integer: boolean): number {
    this.cost.push(cost);
    this.lower.push(lower);
    this.upper.push(upper);
    this.integer.push(integer ? 1 : 0);
    return this.cost.length - 1;
  }

  /** lower ≤ Σ coefficient·column ≤ upper; terms as [column, coefficient] pairs. */
  row(terms: readonly (readonly [number, number])[], lower: number, upper: number): void {
    for (const [column, coefficient] of terms) {
      if (coefficient === 0) continue;
      this.indices.push(column);
      this.values.push(coefficient);
    }
    this.starts.push(this.indices.length);
    this.rowLower.push(lower);
    this.rowUpper.push(upper);
  }

  build(): ModelData {
    const numCols = this.cost.length;
    const numRows = this.rowLower.length;
    return {
      numCols,
      numRows,
      colCost: this.cost,
      colLower: this.lower,
      colUpper: this.upper,
      rowLower: this.rowLower,
      rowUpper: this.rowUpper,
      matrix: { format: "csr", numRows, numCols, starts: this.starts, indices: this.indices, values: this.values },
      integrality: this.integer,
    };
  }
}

export interface MipResult {
  readonly status: "optimal" | "feasible" | "infeasible" | "unknown";
  /** Column values of the best solution found (absent when none was found). */
  readonly values?: Float64Array;
  readonly objective?: number;
  /** Proven lower bound on the optimum. */
  readonly bound: number;
}

export interface MipOptions {
  readonly timeLimitSec: number;
  /** A feasible starting solution (full column vector). */
  readonly start?: Float64Array;
  /** Branch-and-bound nodes it may open before it stops as at the time limit. */
  readonly maxNodes?: number;
}

/** Solves a minimisation MIP with HiGHS, single-threaded and deterministic. */
export function solveMip(highs: Highs, model: ModelData, options: MipOptions): MipResult {
  const instance = highs.createModel();
  try {
    instance.options.set({
      output_flag: false,
      time_limit: Math.max(options.timeLimitSec, 0.001),
      mip_rel_gap: 0,
      mip_abs_gap: 0.999,
      random_seed: 0,
      ...(options.maxNodes === undefined ? {} : { mip_max_nodes: options.maxNodes }),
    });
    instance.passModel(model);
    if (options.start) instance.setSolution({ colValue: options.start });
    const { modelStatus } = instance.run();
    const codes = highs.constants.modelStatus;
    if (modelStatus === codes.infeasible) return { status: "infeasible", bound: Number.POSITIVE_INFINITY };
    const primal = Number(instance.info.get("primal_solution_status"));
    const bound = Number(instance.info.get("mip_dual_bound"));
    const values = primal === 2 ? instance.getSolution().colValue : undefined;
    const objective = values ? instance.getObjectiveValue() : undefined;
    const status = modelStatus === codes.optimal ? "optimal" : values ? "feasible" : "unknown";
    return { status, bound: Number.isFinite(bound) ? bound : 0, ...(values ? { values, objective } : {}) };
  } finally {
    instance.dispose();
  }
}
