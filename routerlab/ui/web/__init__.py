"""The page at the HTTP level: the guard on every request, the queue's wait cap, the heatmap page made in the browser, and the components that check what a client sends."""
