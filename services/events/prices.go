package events

import "hash/fnv"

// Currency is the currency of every order.
const Currency = "eur"

// Price is what one unit of sku costs, in cents: between 1.00 and 99.99,
// drawn from the SKU's name. The example has no catalogue; a price that
// follows from the name lets every party (orders, the provider's ledger,
// the chaos checker) agree on an order's amount without sharing a table.
func Price(sku string) int64 {
	h := fnv.New32a()
	h.Write([]byte(sku)) //nolint:errcheck // a hash never fails to write
	return 100 + int64(h.Sum32()%9_900)
}

// Amount is what an order of lines costs, in cents.
func Amount(lines []Line) int64 {
	var sum int64
	for _, l := range lines {
		sum += Price(l.SKU) * int64(l.Quantity)
	}
	return sum
}
