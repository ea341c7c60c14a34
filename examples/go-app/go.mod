module example.org/go-app

go 1.19

require (
	github.com/fatih/color v1.7.0
	github.com/google/uuid v1.3.0
	github.com/mattn/go-isatty v0.0.17
	github.com/pkg/errors v0.9.1
)

require (
	github.com/mattn/go-colorable v0.1.13 // indirect
	golang.org/x/sys v0.3.0 // indirect
)
