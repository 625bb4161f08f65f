// Loaded in <head>, before the page paints: styles for "JavaScript is on" apply at once.
// (An inline script would need 'unsafe-inline' in the Content-Security-Policy.)
document.documentElement.classList.add("js");
