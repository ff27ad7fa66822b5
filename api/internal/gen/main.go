// Command gen writes the message contracts from the code: api/asyncapi.yaml
// (writeAsyncAPI) and docs/catalog.md (writeCatalog), from the domain's
// message catalogue and internal/consumer.All. It is no part of any
// service binary: `go generate ./api` runs it (the directive is in
// api/embed.go), and so does `make generate`. TestAsyncAPIDocumentIsCurrent
// and TestCatalogPageIsCurrent fail when the committed files are out of
// date.
//
//	gen -asyncapi <file> -catalog <file>
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/yourorg/orders/internal/consumer"
)

// defaults are order-consumer's default queue settings
// (CONSUMER_RETRY_DELAYS, CONSUMER_DELIVERY_LIMIT), so that the committed
// document does not depend on who generated it. cmd/order-consumer's
// TestAsyncAPIStatesTheDefaultQueues holds them to its Config.
var defaults = queueSettings{
	retryDelays:   []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute},
	deliveryLimit: 20,
}

func main() {
	asyncAPI := flag.String("asyncapi", "", "write the AsyncAPI document to this `file`")
	catalog := flag.String("catalog", "", "write the message catalogue page to this `file`")
	flag.Parse()
	if *asyncAPI == "" || *catalog == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	all := consumer.All(consumer.Deps{})
	err := errors.Join(
		writeFile(*asyncAPI, func(w io.Writer) error { return writeAsyncAPI(w, all, defaults) }),
		writeFile(*catalog, func(w io.Writer) error { return writeCatalog(w, all) }),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

// writeFile writes what write makes to path, once it is whole.
func writeFile(path string, write func(io.Writer) error) error {
	var b bytes.Buffer
	if err := write(&b); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
