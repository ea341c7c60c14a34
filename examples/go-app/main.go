// go-app is the Go fixture of layercache's tests: a program whose module dependencies come
// from a module proxy (in the tests, scripts/goproxy.py's directory of Debian's Go packages).
package main

import (
	"fmt"
	"os"

	"github.com/fatih/color"
	"github.com/google/uuid"
	"github.com/mattn/go-isatty"
	"github.com/pkg/errors"
)

func main() {
	id := uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://example.org/layercache"))
	err := errors.Wrap(errors.New("cache"), "layer")
	color.NoColor = !isatty.IsTerminal(os.Stdout.Fd())
	fmt.Println(color.GreenString("go-app"), id, err)
}
