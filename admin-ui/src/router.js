// Navigation inside the console without a reload: /admin/<page>[?query].

export function navigate(path) {
  history.pushState(null, '', `/admin/${path}`);
  dispatchEvent(new PopStateEvent('popstate'));
}

/** The query string of the current URL as an object. */
export function queryParams() {
  return Object.fromEntries(new URLSearchParams(location.search));
}
