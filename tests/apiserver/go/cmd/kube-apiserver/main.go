// kube-apiserver for the e2e-apiserver tests: the upstream command, unchanged, built from the
// k8s.io/kubernetes module so the test suite needs nothing but the Go module proxy.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
