import { HEADLINES, type SimulationReport } from "../../controller/simulator/index.ts";

/** The paper's headline numbers beside ours, as the report's page and the text output show them. */
export interface HeadlineTable {
  readonly header: readonly string[];
  readonly rows: readonly (readonly string[])[];
}

/**
 * The paper's numbers for the reports' preset, with ours as the one seed's value or the mean
 * (range) over the seeds, and their ratio; null for a preset that stands for no figure.
 */
export function headlineTable(reports: readonly SimulationReport[]): HeadlineTable | null {
  const headlines = HEADLINES.filter((h) => h.preset === reports[0]?.preset);
  if (headlines.length === 0) return null;
  const rows = headlines.map((h) => {
    const values = reports.map((r) => h.measure(r)).filter((v): v is number => v !== null);
    const { digits } = h;
    if (values.length === 0) return [h.figure, h.label, h.paper.toFixed(digits), "not run", ""];
    const mean = values.reduce((a, b) => a + b, 0) / values.length;
    const range = values.length > 1 ? ` (${Math.min(...values).toFixed(digits)}–${Math.max(...values).toFixed(digits)})` : "";
    return [h.figure, h.label, h.paper.toFixed(digits), `${mean.toFixed(digits)}${range}`, (mean / h.paper).toFixed(2)];
  });
  const ours = reports.length > 1 ? `ours: mean (range) over ${reports.length} seeds` : "ours";
  return { header: ["fig.", "number", "paper", ours, "ours ÷ paper"], rows };
}
