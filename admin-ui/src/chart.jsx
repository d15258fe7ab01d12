// A uPlot chart as a Preact component: created once, fed new data with setData, resized
// with its container. uPlot draws on a canvas and styles elements through the CSSOM,
// which the console's Content-Security-Policy (no inline styles) allows.
import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

const COLORS = ['#2563eb', '#dc2626', '#059669', '#d97706', '#7c3aed'];

/**
 * series: [{label, color?}], data: [xs (seconds), ys1, ys2, ...]. `yFmt` formats values,
 * `yMin` is the smallest top of the y axis (so a flat line at zero does not fill the
 * chart), `xSpan` the seconds the x axis always shows, ending at the newest point or now;
 * `xPad` seconds of room on both sides (so the outer bars of a bar chart show whole).
 */
export function Chart({ title, series, data, height = 180, yFmt, yMin = 1, xSpan, xPad = 0, bars = false, testid }) {
  const box = useRef(null);
  const plot = useRef(null);

  useEffect(() => {
    const el = box.current;
    const opts = {
      width: Math.max(200, el.clientWidth),
      height,
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false } },
      scales: {
        x: {
          time: true,
          range: (u, min, max) => {
            if (!xSpan) return min == null ? [Date.now() / 1000 - 60, Date.now() / 1000] : [min - xPad, (max > min ? max : min + 1) + xPad];
            // Ends now (or at the newest point): uPlot may hand over a padded range for a
            // single point, so anything beyond a minute from now is ignored.
            const now = Date.now() / 1000;
            const hi = max != null && max <= now + 60 ? Math.max(max, now) : now;
            return [hi - xSpan, hi];
          },
        },
        y: { range: (u, min, max) => [0, Math.max(yMin, max > 0 ? max * 1.15 : 0)] },
      },
      axes: [
        { stroke: '#64748b', grid: { stroke: '#eef2f7' }, ticks: { stroke: '#e2e8f0' } },
        {
          stroke: '#64748b',
          grid: { stroke: '#eef2f7' },
          ticks: { stroke: '#e2e8f0' },
          size: 64,
          values: (u, vals) => vals.map((v) => (yFmt ? yFmt(v) : v)),
        },
      ],
      series: [
        {},
        ...series.map((s, i) => ({
          label: s.label,
          stroke: s.color || COLORS[i % COLORS.length],
          width: 2,
          fill: bars ? `${s.color || COLORS[i % COLORS.length]}66` : undefined,
          paths: bars ? uPlot.paths.bars({ size: [0.7, 40] }) : undefined,
          points: { show: bars ? false : undefined },
          spanGaps: false,
          value: (u, v) => (v == null ? '—' : yFmt ? yFmt(v) : v.toFixed(2)),
        })),
      ],
    };
    plot.current = new uPlot(opts, data, el);
    const ro = new ResizeObserver(() => {
      if (plot.current) plot.current.setSize({ width: Math.max(200, el.clientWidth), height });
    });
    ro.observe(el);
    return () => {
      ro.disconnect();
      plot.current?.destroy();
      plot.current = null;
    };
    // The chart is rebuilt only when its shape changes.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [series.length, height, bars]);

  useEffect(() => {
    plot.current?.setData(data);
  }, [data]);

  return (
    <section class="chart card" data-testid={testid}>
      <h3>{title}</h3>
      <div ref={box} class="chart-box" />
    </section>
  );
}
