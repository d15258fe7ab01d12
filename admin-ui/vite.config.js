// The console's build: `npm run build` writes the files that admin-ui/embed.cmake embeds
// in the binary. The CMake build sets TG_UI_OUT_DIR to <build>/admin-ui-dist.
//
// Everything is served from /admin/ under a Content-Security-Policy without
// 'unsafe-inline': no inline scripts or styles, no data: fonts, so nothing is inlined.
//
// `TG_GATEWAY=http://127.0.0.1:8080 npm run dev` serves the sources with hot reload and
// passes the API, the login session and /metrics to that running gateway (keeping the
// Host header, so the gateway's same-origin check on writes still holds).
import { defineConfig } from 'vite';

const gateway = process.env.TG_GATEWAY;
const proxied = ['/admin/api', '/admin/login', '/admin/logout', '/admin/session', '/metrics'];

export default defineConfig({
  base: '/admin/',
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
  server: gateway ? { proxy: Object.fromEntries(proxied.map((p) => [p, { target: gateway, changeOrigin: false }])) } : {},
  build: {
    outDir: process.env.TG_UI_OUT_DIR || 'dist',
    emptyOutDir: true,
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    sourcemap: false,
    target: 'es2020',
    reportCompressedSize: false,
    chunkSizeWarningLimit: 400,
  },
});
