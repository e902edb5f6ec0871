package dlp

import "testing"

// TestDashedPhoneNumbers: a dashed US number is redacted for public
// destinations without a phone word before it; dates, versions, ISBN-like
// runs, UUIDs, ids named as such and N11 codes pass untouched to every
// class.
func TestDashedPhoneNumbers(t *testing.T) {
	t.Parallel()
	e := mustEngine(t, Config{})
	wantRedacted(t, e, CatPhone, []detection{
		{"reach Dana at 415-839-" + "2271 after 5", "415-839-2271"},
		{`{"emergency":"646-555-` + `2671"}`, "646-555-2671"},
		{"name,number\nDana,212-736-" + "5000\n", "212-736-5000"},
		{"my number is 415-839-" + "2271.", "415-839-2271"},
		{"Sales department 415-839-" + "2271", "415-839-2271"},
		{"order 88, call 415-839-" + "2271", "415-839-2271"},
	}, []Class{ClassPublic}, []Class{ClassExternal, ClassInternal})
	wantUntouched(t, e, []string{
		"released 2024-11-23, due 11-23-2024, v1.415-839-2271 and 415-839-2271-beta",
		"ISBN 978-0-306-40615-7 and 978-316-148-4100 and 0-306-40615-2",
		"uuid 6ba7b810-9dad-11d1-80b4-00c04fd430c8 sha e83c5163316f89bf-415-839-2271",
		"order 415-839-2271 shipped; Ticket: 415-839-2271; part no. 646-555-2671",
		"invoices 415-839-2271, SKU 415-839-2271, serial 212-736-5000, issue #415-839-2271",
		"codes 411-839-2271 and 415-911-2271, 123-456-7890, 415-839-22710",
		"range 100-200-3000 and x415-839-2271 and 415-839-2271x",
		"call Dana, order 415-839-2271",
	}, ClassPublic, ClassExternal, ClassInternal)
}
